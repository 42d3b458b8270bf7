"""``runtime.wait_for_peers``: a fresh node waits before its first step until enough peers' signed records have
arrived, announcing itself with its step-0 evaluation meanwhile (two tiny nodes on one memory network)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from node.config import NodeConfig
from node.model import tiny


@pytest.fixture(scope="module")
def model_dir(tiny_cache: Path) -> Path:
    return tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)


def _cfg(model_dir: Path, **runtime: Any) -> NodeConfig:
    return NodeConfig.model_validate(
        {
            "swarm_id": "barrier",
            "model": {"name": str(model_dir), "device": "cpu"},
            "eval": {"items_per_family": 2, "samples": 2},
            "protocol": {"window_seconds": 1},
            "runtime": {"poll_interval_s": 0.05, **runtime},
        }
    )


async def _node(cfg: NodeConfig, net: Any, run_dir: Path) -> Any:
    from node.runtime import Node, build_parts
    from protocol.channel import Channel
    from protocol.identity import Identity
    from protocol.transport.memory import MemoryTransport
    from protocol.validation import RecordValidator

    ident = Identity.generate()
    transport = MemoryTransport(net, ident.peer_id, protocol=cfg.protocol, swarm=cfg.swarm_id)
    validator = RecordValidator.from_config(cfg.swarm_id, cfg.protocol)
    channel = await Channel.create(ident, transport, validator, work_bits=cfg.protocol.index_work_bits)
    node = await Node.create(cfg, run_dir, channel=channel, parts=build_parts(cfg), name=ident.peer_id, live=False)
    node._spawn(node._poll_forever(cfg.runtime.poll_interval_s), "poll")
    return node


def test_a_node_waits_for_a_peers_record_and_announces_itself_meanwhile(
    model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from protocol.transport.memory import MemoryNetwork

    cfg = _cfg(model_dir, wait_for_peers=1, wait_for_peers_s=2.5)

    async def run() -> tuple[int, int, int, int]:
        net = MemoryNetwork(seed=0)
        a = await _node(cfg, net, tmp_path / "a")
        b = None
        try:
            a.evaluate_start()
            announce = a._eval_outbox
            await a.publish_eval()
            # nobody else in the swarm: it gives up after wait_for_peers_s, re-announcing every (1 s) window
            alone = await a.wait_for_peers(1, asyncio.Event(), announce)
            announced = a.totals["published_evals"]
            b = await _node(cfg, net, tmp_path / "b")
            b.evaluate_start()
            await b.publish_eval()  # b announces itself: a hears it
            heard = await a.wait_for_peers(1, asyncio.Event())
            stopped = asyncio.Event()
            stopped.set()  # a stop (Ctrl-C) ends the wait at once, whatever was heard
            return alone, announced, heard, await a.wait_for_peers(5, stopped)
        finally:
            await a.close()
            if b is not None:
                await b.close()

    with caplog.at_level(logging.INFO, logger="node.runtime"):
        alone, announced, heard, stopped = asyncio.run(run())
    assert alone == 0 and "heard 0 of 1 peers in 2.5 s" in caplog.text
    assert announced == 3  # the first announcement, then once per window while waiting (at 1 s and 2 s)
    assert heard == 1 and "heard 1 peer(s): starting" in caplog.text
    assert stopped == 1


def test_waiting_needs_the_start_evaluation_that_announces_the_node(model_dir: Path) -> None:
    with pytest.raises(ValidationError, match=r"runtime.wait_for_peers=2 needs eval.at_start"):
        NodeConfig.model_validate(
            {"model": {"name": str(model_dir)}, "runtime": {"wait_for_peers": 2}, "eval": {"at_start": False}}
        )
