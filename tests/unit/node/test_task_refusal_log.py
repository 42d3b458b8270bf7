"""A record naming many task families costs a bounded number of log lines (SPEC 6): the independent client sent one
record whose 200 groups named 200 distinct families, and the node wrote 200 lines (43 KB)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from node.config import NodeConfig
from protocol.types import Completion, Envelope, Group, RolloutBatch, TaskRef
from swarm.sapo import ingest_rollouts


def _record(families: list[str]) -> Envelope:
    texts = ("<answer>1</answer>", "<answer>2</answer>")
    completions = tuple(Completion(text=t, n_tokens=2) for t in texts)
    groups = tuple(Group(task=TaskRef(family=f, seed=0, index=1), completions=completions) for f in families)
    batch = RolloutBatch(model="m", policy_version=0, tokenizer="t", groups=groups)
    return Envelope(2, "rollouts", "s", "peer", b"k" * 32, seq=1, window=0, created=0.0, payload=batch)


def test_one_record_of_200_unknown_families_logs_at_most_17_lines(
    tiny_cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from node.model import tiny
    from node.runtime import Node, build_parts

    model_dir = tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)
    cfg = NodeConfig.model_validate({"model": {"name": str(model_dir), "device": "cpu"}})
    hostile = [f"fam{i}@1" for i in range(200)] + [f"chain_sum@v{i}" for i in range(20)]

    async def run():
        node = await Node.create(cfg, tmp_path / "n", parts=build_parts(cfg), live=False)
        try:
            for _ in range(2):  # the same record again adds no line
                node.ingest_counts.update(ingest_rollouts(node.pool, _record(hostile), node.score_external, 0))
            return node.ingest_counts
        finally:
            await node.close()

    with caplog.at_level(logging.DEBUG, logger="node.runtime"):
        counts = asyncio.run(run())
    assert counts["task_unknown"] == 400 and counts["task_version"] == 40  # every drop is still counted
    lines = [r.getMessage() for r in caplog.records if "dropping peers' groups" in r.getMessage()]
    assert len(lines) == 16 + 1, len(lines)  # 16 pairs (as SPEC 15 caps versions), then the cap's own line
    assert "further ones are counted in rejected_by_reason, not logged" in lines[-1]
