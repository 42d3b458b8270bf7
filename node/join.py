"""``swarm-node join`` behind the argument parser: config, identity, network, node, signals, clean shutdown.

Start order matters to users: the network comes up first and its addresses are printed at once (so other
nodes can join while this one is still loading its model), then the node is built and trains. SIGINT or
SIGTERM stops after the current step with a checkpoint, flushed metrics and the transport closed; a second
signal stops harder (it skips waiting for an in-flight publish).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from node.config import NodeConfig
from protocol.config import load_config, write_resolved

logger = logging.getLogger(__name__)


def resolve_config(
    config_path: Path | None,
    overrides: list[str],
    *,
    peers: list[str],
    host: str | None,
    port: int | None,
) -> NodeConfig:
    """YAML + ``--set`` overrides + the network flags, validated; a bad value is one ConfigError line."""
    sets = list(overrides)
    if peers:
        sets.append("transport.initial_peers=[" + ", ".join(f'"{p}"' for p in peers) + "]")
    if host is not None:
        sets.append(f"transport.host={host}")
    if port is not None:
        sets.append(f"transport.port={port}")
    return load_config(NodeConfig, config_path, sets)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _join(cfg: NodeConfig, run_dir: Path, identity_path: Path, max_steps: int | None, resume: bool) -> int:
    from node.runtime import Node
    from protocol.channel import open_channel
    from protocol.identity import Identity

    ident = Identity.load_or_create(identity_path)
    channel = await open_channel(cfg.transport, cfg.protocol, cfg.swarm_id, ident)
    node = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    hits = {"n": 0}

    def on_signal(signum: int) -> None:
        hits["n"] += 1
        if hits["n"] == 1:
            logger.warning("signal %d: stopping after the current step", signum)
            _say(f"stopping (signal {signum}): finishing the current step, then checkpoint")
            stop.set()
        else:
            _say("second signal: stopping now")
            for task in asyncio.all_tasks(loop):
                if task is not asyncio.current_task(loop):
                    task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        _say(f"peer id {ident.peer_id}")
        for addr in channel.addresses():
            _say(f"listening on {addr}")
        node = await Node.create(cfg, run_dir, channel=channel, name=ident.peer_id, resume=resume)
        if max_steps is not None and node.step >= max_steps:
            _say(f"already at step {node.step} >= --max-steps {max_steps}; nothing to do")
            return 0
        final = await node.run(max_steps=max_steps, stop=stop)
        _say(
            f"stopped at step {node.step}: reward_mean {final.get('reward_mean', 0.0):.3f}, "
            f"peers {final.get('peers', 0)}, metrics in {node.metrics_path}"
        )
        return 0
    finally:
        if node is not None:
            await node.close()
        else:
            with contextlib.suppress(Exception):
                await channel.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def run_join(
    *,
    run_dir: Path,
    config_path: Path | None,
    overrides: list[str],
    peers: list[str],
    host: str | None,
    port: int | None,
    identity_path: Path | None,
    max_steps: int | None,
    resume: bool,
) -> int:
    """Validate everything that can be validated before starting anything, then run the node to the end."""
    from node.preflight import check_model_name, check_output_dir, check_peers, make_output_dir

    cfg = resolve_config(config_path, overrides, peers=peers, host=host, port=port)
    # Cheap checks first, creating nothing, so a typo costs a second and leaves no half-made run dir behind.
    check_model_name(cfg.model.name)
    check_peers(getattr(cfg.transport, "initial_peers", []), cfg.transport.type)
    check_output_dir(run_dir)
    if identity_path is not None and not identity_path.exists():
        check_output_dir(identity_path.expanduser().absolute().parent, "identity key's directory")
    make_output_dir(run_dir)
    write_resolved(cfg, run_dir)
    return asyncio.run(_join(cfg, run_dir, identity_path or run_dir / "identity.key", max_steps, resume))
