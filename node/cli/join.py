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
import tracemalloc
from pathlib import Path
from typing import Any

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
    """YAML + ``--set`` overrides + the network flags, validated; a bad value is one ConfigError line.

    The memory transport is an in-process network with no address and no peers to dial: the network flags are then
    ignored with one warning line (naming the flags) instead of failing on fields the memory config does not have."""
    sets = list(overrides)
    flags = [f for f, v in (("--peers", peers), ("--host", host), ("--port", port)) if v]
    if flags and load_config(NodeConfig, config_path, sets).transport.type == "memory":
        logger.warning(
            "%s ignored with --transport memory (an in-process network: no address, no peers)", ", ".join(flags)
        )
        return load_config(NodeConfig, config_path, sets)
    if peers:
        sets.append("transport.initial_peers=[" + ", ".join(f'"{p}"' for p in peers) + "]")
    if host is not None:
        sets.append(f"transport.host={host}")
    if port is not None:
        sets.append(f"transport.port={port}")
    return load_config(NodeConfig, config_path, sets)


def _say(line: str) -> None:
    # the real stdout: a library's generator may have redirected sys.stdout in another thread for a moment
    out = sys.__stdout__ or sys.stdout
    out.write(line + "\n")
    out.flush()


def _shown_peer_id(addresses: list[str], fallback: str) -> str:
    """The id peers dial (the ``/p2p/...`` part of the listening addresses); the signing key's id without one."""
    for addr in addresses:
        if "/p2p/" in addr:
            return addr.rsplit("/p2p/", 1)[1]
    return fallback


async def _in_daemon_thread(fn, *args):  # type: ignore[no-untyped-def]
    """Run a blocking call in a daemon thread: unlike ``asyncio.to_thread``, a Ctrl-C during a long model build
    does not make the process wait for it to finish (asyncio.run joins its executor's threads on exit)."""
    import threading

    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def settle(result: Any = None, error: BaseException | None = None) -> None:
        if fut.done():  # cancelled by a signal meanwhile
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def run() -> None:
        error: BaseException | None = None
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody waits for it any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="build-node", daemon=True).start()
    return await fut


async def _join(
    cfg: NodeConfig, run_dir: Path, identity_path: Path, max_steps: int | None, resume: bool, linger_s: float = 0.0
) -> int:
    from node.runtime import Node, build_parts
    from protocol.channel import open_channel
    from protocol.identity import Identity

    ident = Identity.load_or_create(identity_path)
    channel = await open_channel(cfg.transport, cfg.protocol, cfg.swarm_id, ident)
    node = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    hits = {"n": 0}

    def on_signal(signum: int) -> None:
        hits["n"] += 1
        if hits["n"] == 1 and node is not None:
            logger.info("signal %d: stopping after the current step", signum)
            _say(f"stopping (signal {signum}): finishing the current step, then checkpoint")
            stop.set()
        elif hits["n"] == 1:  # still loading: nothing to checkpoint, stop now
            _say(f"stopping (signal {signum}) before training started")
            if main is not None:
                main.cancel()
        else:
            _say("second signal: stopping now")
            for task in asyncio.all_tasks(loop):
                if task is not asyncio.current_task(loop):
                    task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    if tracemalloc.is_tracing():  # PYTHONTRACEMALLOC=<frames>: SIGUSR2 writes where the heap goes (heapdump)
        from node.telemetry import heapdump

        loop.add_signal_handler(signal.SIGUSR2, lambda: _say(f"heap sites written to {heapdump.dump(run_dir)}"))
    try:
        addresses = channel.addresses()
        _say(f"peer id {_shown_peer_id(addresses, ident.peer_id)}")
        for addr in addresses:
            _say(f"listening on {addr}")
        parts = await _in_daemon_thread(build_parts, cfg)
        node = await Node.create(cfg, run_dir, channel=channel, parts=parts, name=ident.peer_id, resume=resume)
        if node.step > 0:
            _say(f"resumed from step {node.step} (policy version {node.learner.policy_version})")
        final = await node.run(max_steps=max_steps, stop=stop)
        _say(
            f"stopped at step {node.step}: reward_mean {final.get('reward_mean', 0.0):.3f}, "
            f"peers {final.get('peers', 0)}, metrics in {node.metrics_path}"
        )
        if linger_s > 0 and not stop.is_set():
            _say(f"staying in the swarm {linger_s:g} s more (--linger), not training; Ctrl-C leaves now")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=linger_s)
        return 0
    except asyncio.CancelledError:
        if hits["n"] == 0:
            raise
        return 130 if hits["n"] > 1 else 0
    finally:
        if node is not None:
            await node.close()
        else:
            with contextlib.suppress(Exception):
                await channel.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if hits["n"] > 1:
            # "Stopping now": the checkpoint and metrics are written, but the step's evaluation or rollout may still
            # run in a worker thread, which asyncio.run (and then the interpreter) would wait for -- a real model's
            # full-size evaluation kept a twice-signalled node busy for ten minutes. End the process here.
            exit_process(130)


def _already_done(run_dir: Path, max_steps: int | None, resume: bool) -> int | None:
    """The step of the run dir's latest intact checkpoint when it already reaches ``max_steps``, else None."""
    if max_steps is None or not resume or not (run_dir / "checkpoints").is_dir():
        return None
    from node.learn.checkpoint import load_latest

    ckpt = load_latest(run_dir / "checkpoints")
    return ckpt.step if ckpt is not None and ckpt.step >= max_steps else None


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
    linger_s: float = 0.0,
) -> int:
    """Validate everything that can be validated before starting anything, then run the node to the end (and
    ``linger_s`` seconds beyond ``max_steps``, still in the swarm)."""
    from node.cli.preflight import check_model_name, check_output_dir, check_peers, check_trackers, make_output_dir

    cfg = resolve_config(config_path, overrides, peers=peers, host=host, port=port)
    if cfg.runtime.malloc_arena_max:
        # before any thread allocates (torch, hivemind, the event loop's workers): a cap holds for arenas made later
        from node.heap import limit_arenas

        limit_arenas(cfg.runtime.malloc_arena_max)
    # Cheap checks first, creating nothing, so a typo costs a second and leaves no half-made run dir behind.
    check_model_name(cfg.model.name)
    check_peers(getattr(cfg.transport, "initial_peers", []), cfg.transport.type)
    check_trackers(cfg.report_to)
    check_output_dir(run_dir)
    # every configured task family (installed, named, versioned, its config accepted) before the model build
    from node.tasks.registry import check_families

    check_families(cfg.tasks.families)
    if identity_path is not None and not identity_path.exists():
        check_output_dir(identity_path.expanduser().absolute().parent, "identity key's directory")
    if cfg.rollout.engine == "vllm" and cfg.vllm.mode == "in_process":
        # a missing or broken vLLM is one error line naming the fix, before the network starts (a few seconds)
        from node.rollout.engine_vllm import check_install

        check_install()
    make_output_dir(run_dir)
    done = _already_done(run_dir, max_steps, resume)
    if done is not None:
        _say(f"{run_dir} is already at step {done} >= --max-steps {max_steps} (a total); nothing to do")
        return 0
    write_resolved(cfg, run_dir)
    key = identity_path or run_dir / "identity.key"
    return asyncio.run(_join(cfg, run_dir, key, max_steps, resume, linger_s))


def exit_process(code: int) -> None:
    """End the process now that the node is closed (checkpoint, metrics and transport done).

    The interpreter's own exit can stall for many seconds or hang: a final garbage collection over the model,
    tokenizer and task caches, and joins of worker threads that hivemind or torch left blocked on a dead
    daemon's socket. Nothing is left to clean up, so flush the output and let the OS reclaim the rest.
    """
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
