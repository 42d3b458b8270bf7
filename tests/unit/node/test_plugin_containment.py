"""A faulty task plug-in costs its own groups and is counted, never the node: each fault in each place.

The faults: ``score()`` raises, returns junk (NaN), or never returns. The places: peers' items (the receive path),
the node's own rollouts, and its own held-out evaluation. In each place a real node (the reduced built-in model)
meets every fault, goes on with its other family, counts the failures in its metrics line, and -- for its own items
-- quarantines the faulty family (no longer drawn or evaluated) with one log line each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from node.config import NodeConfig
from node.tasks import registry
from protocol.types import Completion, Envelope, Group, RolloutBatch, TaskRef
from swarm.sapo import ingest_rollouts

#: A good family and three whose scorer fails: on a completion saying FAULT, or on every completion once
#: ``ALWAYS`` is set (own completions of the tiny model never say FAULT).
PLUGINS = """
import math, threading

RELEASE = threading.Event()
ALWAYS = False


class Good:
    name = "good_n"
    version = "1"

    def size(self, config):
        return 1000

    def generate(self, config, seed, index):
        return {"question": f"Echo {index}.", "answer": str(index), "metadata": {}}

    def score(self, item, completion):
        return 1.0 if f"<answer>{item.answer}</answer>" in completion else 0.0


def _faulty(completion):
    return ALWAYS or "FAULT" in completion


class Raises(Good):
    name = "raises_n"

    def score(self, item, completion):
        if _faulty(completion):
            raise RuntimeError("a bug in the scorer")
        return super().score(item, completion)


class Nan(Good):
    name = "nan_n"

    def score(self, item, completion):
        return math.nan if _faulty(completion) else super().score(item, completion)


class Hangs(Good):
    name = "hangs_n"

    def score(self, item, completion):
        if _faulty(completion):
            RELEASE.wait(60)
        return super().score(item, completion)
"""
FAULTY = ("raises_n@1", "nan_n@1", "hangs_n@1")
REASON = {"raises_n@1": "plugin_error", "nan_n@1": "plugin_junk", "hangs_n@1": "plugin_timeout"}


@pytest.fixture
def faulty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The plug-ins above as an installed distribution; hung scorer threads released afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "faulty_tasks.py").write_text(PLUGINS)
    info = site / "faulty_tasks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty-tasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [rl_swarm.tasks]
            good_n = faulty_tasks:Good
            raises_n = faulty_tasks:Raises
            nan_n = faulty_tasks:Nan
            hangs_n = faulty_tasks:Hangs
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    import faulty_tasks

    yield faulty_tasks
    faulty_tasks.RELEASE.set()
    sys.modules.pop("faulty_tasks", None)


@pytest.fixture
def tiny_model(tiny_cache: Path) -> Path:
    from node.model import tiny

    return tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)


def _config(model_dir: Path, **eval_cfg: Any) -> NodeConfig:
    return NodeConfig.model_validate(
        {
            "model": {"name": str(model_dir), "device": "cpu"},
            "tasks": {
                "families": [{"name": n} for n in ("good_n", "raises_n", "nan_n", "hangs_n")],
                "plugin_timeout_s": 0.2,
                "plugin_quarantine_after": 3,
            },
            "rollout": {"prompts_per_step": 8, "group_size": 2, "max_new_tokens": 6},
            "eval": {"every_steps": None, "at_start": False, "at_end": False, **eval_cfg},
        }
    )


def _run(cfg: NodeConfig, run_dir: Path, body: Any) -> Any:
    from node.runtime import Node, build_parts

    async def main() -> Any:
        node = await Node.create(cfg, run_dir, parts=build_parts(cfg), live=False)
        try:
            return await body(node)
        finally:
            await node.close()

    return asyncio.run(main())


def _quarantine_lines(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    lines = [r.getMessage() for r in caplog.records if "is quarantined until the node restarts" in r.getMessage()]
    return Counter(next(f for f in FAULTY if repr(f) in line) for line in lines)


def _train_ref(node: Any, family: str, start: int = 0) -> TaskRef:
    for index in range(start, 1000):
        ref = TaskRef(family=family, seed=0, index=index)
        if node.tasks.side(node.tasks.materialize(ref)) == "train":
            return ref
    raise AssertionError("no train item")


def _group(ref: TaskRef, *texts: str) -> Group:
    return Group(task=ref, completions=tuple(Completion(text=t, n_tokens=2) for t in texts))


def _envelope(groups: list[Group], seq: int) -> Envelope:
    batch = RolloutBatch(model="m", policy_version=0, tokenizer="t", groups=tuple(groups))
    return Envelope(2, "rollouts", "s", "peer", b"k" * 32, seq=seq, window=0, created=0.0, payload=batch)


def test_faults_on_peers_items_cost_their_groups(
    faulty: Any, tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer's items: each faulty group is dropped and counted by reason; raising and junk never quarantine (a
    stranger chose the item), two calls that never return do; the node then trains on."""

    async def body(node: Any) -> tuple[Counter[str], dict[str, Any]]:
        groups = []
        for family in FAULTY:
            for k in range(3):
                ref = _train_ref(node, family, 10 * k)
                groups.append(_group(ref, "<answer>FAULT</answer>", f"<answer>{ref.index}</answer>"))
        good = _train_ref(node, "good_n@1")
        groups.append(_group(good, "x", f"<answer>{good.index}</answer>"))
        for seq, g in enumerate(groups, start=1):
            node.ingest_counts.update(ingest_rollouts(node.pool, _envelope([g], seq), node.score_external, node.step))
        line = await node.step_once(poll=False)
        return node.ingest_counts, line

    with caplog.at_level(logging.INFO):
        counts, line = _run(_config(tiny_model), tmp_path / "n", body)
    assert counts["accepted"] == 1
    assert counts["plugin_error"] == 3 and counts["plugin_junk"] == 3
    assert counts["plugin_timeout"] == 2 and counts["plugin_quarantined"] == 1  # the third after two stuck calls
    assert line["step"] == 1
    assert line["rejected_by_reason"]["plugin_error"] == 3
    failures = line["plugin_failures"]
    assert failures["raises_n@1"]["plugin_error"] == 3 and failures["nan_n@1"]["plugin_junk"] == 3
    assert failures["hangs_n@1"] == {"plugin_timeout": 2}
    assert line["quarantined_families"] == ["hangs_n@1"]
    assert _quarantine_lines(caplog) == Counter({"hangs_n@1": 1})


def test_faults_on_own_rollouts_quarantine_the_family_and_the_node_goes_on(
    faulty: Any, tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Own completions: a failing scorer scores 0 and is counted; a family failing ``plugin_quarantine_after``
    times in a row (or hanging twice) is quarantined with one line and no longer drawn; the good family goes on."""
    faulty.ALWAYS = True

    async def body(node: Any) -> list[dict[str, Any]]:
        lines = []
        for _ in range(6):
            lines.append(await node.step_once(poll=False))
        return lines

    with caplog.at_level(logging.INFO):
        lines = _run(_config(tiny_model), tmp_path / "n", body)
    last = lines[-1]
    assert last["step"] == 6
    assert last["quarantined_families"] == sorted(FAULTY)
    for family in FAULTY:
        assert last["plugin_failures"][family][REASON[family]] >= 2
    assert last["plugin_own_failures"] >= 3 + 3 + 2
    assert _quarantine_lines(caplog) == Counter(dict.fromkeys(FAULTY, 1))
    rollouts = (tmp_path / "n" / "rollouts.jsonl").read_text().splitlines()
    assert '"good_n@1"' in rollouts[-1]
    last_step = [json.loads(r) for r in rollouts if json.loads(r)["step"] == 6]
    assert {r["task"]["family"] for r in last_step} == {"good_n@1"}  # quarantined families are no longer drawn


def test_faults_in_own_evaluation_leave_the_family_out(
    faulty: Any, tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Held-out evaluation: each faulty family is quarantined and left out of the result; the good family is
    evaluated, and the node trains on afterwards without drawing the faulty ones."""
    faulty.ALWAYS = True

    async def body(node: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        result = await asyncio.to_thread(node.evaluate, 0)
        return result, await node.step_once(poll=False)

    cfg = _config(tiny_model, items_per_family=3, samples=2, greedy=False)
    with caplog.at_level(logging.INFO):
        result, line = _run(cfg, tmp_path / "n", body)
    assert set(result["families"]) == {"good_n@1"}
    assert line["quarantined_families"] == sorted(FAULTY)
    assert line["plugin_failures"]["raises_n@1"] == {"plugin_error": 3}
    assert line["plugin_failures"]["nan_n@1"] == {"plugin_junk": 3}
    assert line["plugin_failures"]["hangs_n@1"] == {"plugin_timeout": 2}
    assert _quarantine_lines(caplog) == Counter(dict.fromkeys(FAULTY, 1))
    assert line["step"] == 1
