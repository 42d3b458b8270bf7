"""Task plug-ins (``node.tasks.family``): found by entry point, versioned on the wire, and contained when hostile.

The plug-ins here are real installed distributions as far as ``importlib.metadata`` can tell: a ``*.dist-info``
folder with an ``entry_points.txt`` on ``sys.path``, beside the module it names.
"""

from __future__ import annotations

import asyncio
import logging
import random
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from node.config import NodeConfig, TaskConfig
from node.tasks import PluginError, TaskError, TaskSource, registry
from node.tasks.guard import PluginGuard
from protocol.types import Completion, Envelope, Group, RolloutBatch, TaskRef
from swarm.pool import RolloutPool
from swarm.sapo import ingest_rollouts

#: A well-behaved family and four hostile ones, keyed by what they do wrong on a peer's item.
PLUGINS = '''
import math, threading, time

RELEASE = threading.Event()


class Echo:
    """Question ``Echo N.``; the answer N; partial credit 0.5 for any other <answer>."""
    name = "echo_n"
    version = "VERSION"

    def size(self, config):
        return 1000

    def generate(self, config, seed, index):
        return {"question": f"Echo {seed * 1000 + index}.", "answer": str(seed * 1000 + index), "metadata": {}}

    def score(self, item, completion):
        if f"<answer>{item.answer}</answer>" in completion:
            return 1.0
        return 0.5 if "<answer>" in completion else 0.0

    def trace(self, item):
        return f"<think>copy {item.answer}</think><answer>{item.answer}</answer>"


class Raises(Echo):
    name = "raises_n"

    def generate(self, config, seed, index):
        if index >= 500:
            raise ZeroDivisionError("a peer's index")
        return super().generate(config, seed, index)


class Hangs(Echo):
    name = "hangs_n"

    def score(self, item, completion):
        if "hang" in completion:
            RELEASE.wait(60)
        return super().score(item, completion)


class Junk(Echo):
    name = "junk_n"

    def generate(self, config, seed, index):
        if index >= 500:
            return ["not", "a", "mapping"]
        return super().generate(config, seed, index)

    def score(self, item, completion):
        if "nan" in completion:
            return math.nan
        if "big" in completion:
            return 7.0
        if "str" in completion:
            return "1.0"
        return super().score(item, completion)


class IntVersion(Echo):
    name = "int_version_n"
    version = 1


class Picky(Echo):
    name = "picky_n"

    def check_config(self, config):
        if "level" not in config:
            raise ValueError("picky_n needs a 'level' in its config")


class Pair(Echo):
    """A symmetric problem: gcd(a, b) is gcd(b, a), but the default split key is the question text."""
    name = "pair_n"

    def generate(self, config, seed, index):
        import math, random
        rng = random.Random(f"{seed}:{index}")
        a, b = rng.randint(1, 12), rng.randint(1, 12)
        return {"question": f"gcd({a}, {b})?", "answer": str(math.gcd(a, b)), "metadata": {}}


class KeyedPair(Pair):
    name = "keyed_pair_n"

    def split_key(self, question):
        a, b = sorted(int(n) for n in question[4:-2].split(", "))
        return f"gcd:{a},{b}"


def make_echo():
    return Echo()
'''


def install_plugin_dist(site: Path, version: str = "1", extra_entry: str = "") -> None:
    """A distribution ``fake-tasks`` with the module above and its entry points, as pip would leave it."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "fake_tasks.py").write_text(PLUGINS.replace("VERSION", version))
    info = site / "fake_tasks-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-tasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [rl_swarm.tasks]
            echo_n = fake_tasks:make_echo
            raises_n = fake_tasks:Raises
            hangs_n = fake_tasks:Hangs
            junk_n = fake_tasks:Junk
            int_version_n = fake_tasks:IntVersion
            picky_n = fake_tasks:Picky
            pair_n = fake_tasks:Pair
            keyed_pair_n = fake_tasks:KeyedPair
            """
        )
        + extra_entry
    )


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake distribution on ``sys.path``, the family cache emptied before and after."""
    import sys

    site = tmp_path / "site"
    install_plugin_dist(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    yield site
    mod = sys.modules.get("fake_tasks")
    if mod is not None:
        mod.RELEASE.set()  # let a hung scorer thread finish
    sys.modules.pop("fake_tasks", None)


def _source(*names: str, timeout: float = 5.0) -> TaskSource:
    return TaskSource(TaskConfig(families=[{"name": n} for n in names], plugin_timeout_s=timeout))


def test_an_entry_point_family_trains_with_its_version_on_the_wire(plugins: Path) -> None:
    src = _source("echo_n", "chain_sum")
    assert src.families == ["echo_n@1", "chain_sum"]  # built-ins stay unversioned
    refs = src.sample(random.Random(0), 20)
    assert {r.family for r in refs} == {"echo_n@1", "chain_sum"}
    item = src.materialize(next(r for r in refs if r.family == "echo_n@1"))
    assert item.question == f"Echo {item.ref.index}." and item.answer == str(item.ref.index)
    assert src.score(item, f"<answer>{item.answer}</answer>") == 1.0
    assert src.score(item, "<answer>nope</answer>") == 0.5
    assert src.trace(item) == f"<think>copy {item.answer}</think><answer>{item.answer}</answer>"
    chain = src.materialize(next(r for r in refs if r.family == "chain_sum"))
    assert src.trace(chain) is None
    # the lab families write their working through the same method
    lab = _source("lab_add")
    lab_item = lab.materialize(lab.sample(random.Random(0), 1)[0])
    written = lab.trace(lab_item)
    assert written.startswith("<think>") and written.endswith(f"<answer>{lab_item.answer}</answer>")


def test_receiver_without_the_plugin_or_with_another_version_refuses_by_reason(plugins: Path, tmp_path: Path) -> None:
    mine = _source("echo_n")
    other_version = TaskRef(family="echo_n@2", seed=0, index=3)
    unknown = TaskRef(family="never_installed@1", seed=0, index=3)
    not_mine = TaskRef(family="chain_sum", seed=0, index=3)
    foreign_config = TaskRef(family="echo_n@1", config={"hard": True}, seed=0, index=3)
    reasons = {}
    for ref in (other_version, unknown, not_mine, foreign_config):
        with pytest.raises(TaskError) as e:
            mine.materialize(ref)
        reasons[ref.family + str(dict(ref.config))] = e.value.reason
    assert reasons == {
        "echo_n@2{}": "task_version",
        "never_installed@1{}": "task_unknown",
        "chain_sum{}": "task_rejected",
        "echo_n@1{'hard': True}": "task_rejected",
    }


def test_a_plugin_name_may_not_shadow_a_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site2"
    install_plugin_dist(site, extra_entry="chain_sum = fake_tasks:make_echo\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    with pytest.raises(TaskError, match="built-in family 'chain_sum'"):
        _source("chain_sum")


def test_every_configured_family_is_checked_up_front_one_line_each(tmp_path: Path, monkeypatch) -> None:
    """``check_families`` (run by ``swarm-node join`` and ``swarm-sim run`` before any model is built): a clash with
    a built-in name, a version given as a number, a ``check_config`` that raises, an unknown name -- one line each,
    every family checked, the good ones silent."""
    from node.config import TaskFamily
    from node.tasks.family import FamilyConfigError
    from node.tasks.registry import check_families

    site = tmp_path / "site3"
    install_plugin_dist(site, extra_entry="gcd = fake_tasks:make_echo\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    families = [
        TaskFamily(name="echo_n"),
        TaskFamily(name="gcd"),
        TaskFamily(name="int_version_n"),
        TaskFamily(name="picky_n"),
        TaskFamily(name="picky_n", config={"level": 2}),
        TaskFamily(name="no_such_family"),
        TaskFamily(name="chain_sum", config={"seed": 3}),
    ]
    with pytest.raises(FamilyConfigError) as e:
        check_families(families)
    problems = e.value.problems
    assert len(problems) == 5, problems
    assert "built-in family 'gcd'; rename the plug-in" in problems[0]
    assert 'version must be a string such as "1"' in problems[1] and "not the int 1" in problems[1]
    assert "'picky_n': check_config({}) refused it: picky_n needs a 'level'" in problems[2]
    assert "unknown task family 'no_such_family'" in problems[3]
    assert "remove 'seed'" in problems[4]
    assert str(e.value).count("\nerror: ") == 4  # the CLI prints "error: " before the first
    assert all("\n" not in p for p in problems)
    check_families([TaskFamily(name="echo_n"), TaskFamily(name="picky_n", config={"level": 1})])


def test_an_unknown_family_is_one_clear_error() -> None:
    with pytest.raises(TaskError, match="unknown task family 'no_such_family'.*rl_swarm.tasks"):
        _source("no_such_family")


def _envelope(groups: list[Group]) -> Envelope:
    batch = RolloutBatch(model="m", policy_version=0, tokenizer="t", groups=tuple(groups))
    return Envelope(2, "rollouts", "s", "peer", b"k" * 32, seq=1, window=0, created=0.0, payload=batch)


def _group(ref: TaskRef, *texts: str) -> Group:
    return Group(task=ref, completions=tuple(Completion(text=t, n_tokens=2) for t in texts))


def test_hostile_plugins_cost_one_group_each_counted_by_reason(plugins: Path) -> None:
    src = _source("echo_n", "raises_n", "hangs_n", "junk_n", timeout=0.3)

    def scorer(ref: TaskRef, texts):
        item = src.materialize_for_training(ref)
        return [src.score(item, t) for t in texts]

    def train_ref(name: str, index_from: int = 0) -> TaskRef:
        """A train-side ref of ``name`` from ``index_from`` on (indices below 500 generate fine in every family)."""
        for index in range(index_from, 500):
            ref = TaskRef(family=f"{name}@1", seed=0, index=index)
            if src.side(src.materialize(ref)) == "train":
                return ref
        raise AssertionError("no train item")

    right = lambda ref: f"<answer>{ref.index}</answer>"  # noqa: E731
    groups = [
        _group(train_ref("echo_n"), right(train_ref("echo_n")), "<answer>x</answer>"),  # honest: accepted
        _group(TaskRef(family="raises_n@1", seed=0, index=777), "<answer>1</answer>", "x"),  # generate raises
        _group(TaskRef(family="junk_n@1", seed=0, index=777), "<answer>1</answer>", "x"),  # generate returns junk
        _group(train_ref("junk_n"), "<answer>nan</answer>", "x"),  # score NaN
        _group(train_ref("junk_n"), "<answer>big</answer>", "x"),  # score outside [0, 1]
        _group(train_ref("junk_n"), "<answer>str</answer>", "x"),  # score not a number
        _group(train_ref("hangs_n"), "<answer>hang</answer>", "x"),  # score never returns
        # a second stuck call: the family is quarantined after it
        _group(train_ref("hangs_n", train_ref("hangs_n").index + 1), "<answer>hang</answer>", "x"),
        _group(train_ref("hangs_n", 2), "<answer>2</answer>", "x"),  # refused at once while quarantined
        _group(TaskRef(family="echo_n@9", seed=0, index=1), "<answer>1</answer>", "x"),  # another version
        _group(TaskRef(family="not_here@1", seed=0, index=1), "<answer>1</answer>", "x"),  # not installed here
    ]
    pool = RolloutPool(100, 50)
    t0 = time.monotonic()
    counts = ingest_rollouts(pool, _envelope(groups), scorer, step=0)
    elapsed = time.monotonic() - t0
    assert counts == Counter(
        accepted=1,
        plugin_error=1,
        plugin_junk=4,
        plugin_timeout=2,
        plugin_quarantined=1,
        task_version=1,
        task_unknown=1,
    ), counts
    assert elapsed < 5, f"two timed-out calls of 0.3 s each took {elapsed:.1f} s in all"
    assert len(pool) == 1
    assert src.guard.stuck("hangs_n@1") == 2
    import fake_tasks

    fake_tasks.RELEASE.set()  # the stuck calls return; the family stays quarantined for the life of the source
    deadline = time.monotonic() + 5
    while src.guard.stuck("hangs_n@1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert src.quarantined.keys() == {"hangs_n@1"}
    with pytest.raises(PluginError) as e:
        src.materialize(TaskRef(family="hangs_n@1", seed=0, index=3))
    assert e.value.reason == "plugin_quarantined"
    m = src.metrics()
    assert m["quarantined_families"] == ["hangs_n@1"]
    assert m["plugin_failures"] == {
        "hangs_n@1": {"plugin_timeout": 2},
        "junk_n@1": {"plugin_junk": 4},
        "raises_n@1": {"plugin_error": 1},
    }
    # own draws skip the quarantined family; the indices >= 500 that raise_n and junk_n fail on are redrawn
    assert {r.family for r in src.sample(random.Random(1), 40)} == {"echo_n@1", "raises_n@1", "junk_n@1"}
    assert not src.quarantined.keys() - {"hangs_n@1"}


def test_guard_counts_a_call_that_returns_late_only_while_it_runs() -> None:
    guard = PluginGuard(timeout_s=0.05, max_stuck=1)
    release = threading.Event()
    with pytest.raises(PluginError) as e:
        guard.call("f", "score", release.wait, 10)
    assert e.value.reason == "plugin_timeout" and guard.stuck("f") == 1
    with pytest.raises(PluginError) as e:
        guard.call("f", "score", lambda: 1.0)
    assert e.value.reason == "plugin_quarantined"
    release.set()
    deadline = time.monotonic() + 5
    while guard.stuck("f") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert guard.call("f", "score", lambda: 2.0) == 2.0
    with pytest.raises(PluginError) as e:
        guard.call("f", "score", lambda: 1 / 0)
    assert e.value.reason == "plugin_error" and isinstance(e.value.__cause__, ZeroDivisionError)


def test_node_drops_and_counts_peer_groups_and_logs_once_per_family(
    plugins: Path, tiny_cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from node.model import tiny
    from node.runtime import Node, build_parts

    model_dir = tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)
    cfg = NodeConfig.model_validate(
        {
            "model": {"name": str(model_dir), "device": "cpu"},
            "tasks": {"families": [{"name": "echo_n"}, {"name": "junk_n"}], "plugin_timeout_s": 1.0},
        }
    )

    async def run() -> tuple[Counter, float]:
        node = await Node.create(cfg, tmp_path / "n", parts=build_parts(cfg), live=False)
        try:
            envs = [
                _envelope([_group(TaskRef(family="echo_n@2", seed=0, index=i), "<answer>1</answer>", "x")])
                for i in range(3)
            ]
            # a peer training echo_n on another config: task_rejected, one INFO line for the family
            envs += [
                _envelope([_group(TaskRef(family="echo_n@1", config={"hard": i}, seed=0, index=1), "a", "b")])
                for i in range(2)
            ]
            for env in envs:
                node.ingest_counts.update(ingest_rollouts(node.pool, env, node.score_external, node.step))
            # an own completion the plug-in fails on scores 0 and the node goes on
            item = node.tasks.materialize(TaskRef(family="junk_n@1", seed=0, index=1))
            own = node.reward(item, "<answer>nan</answer>")
            return node.ingest_counts, own
        finally:
            await node.close()

    with caplog.at_level(logging.INFO, logger="node.runtime"):
        counts, own = asyncio.run(run())
    assert counts["task_version"] == 3 and counts["task_rejected"] == 2
    assert own == 0.0
    lines = [r.getMessage() for r in caplog.records if "dropping peers' groups" in r.getMessage()]
    assert len([m for m in lines if "'echo_n@2'" in m]) == 1, lines  # three groups, one line
    rejected = [r for r in caplog.records if "task_rejected" in r.getMessage()]
    assert len(rejected) == 1 and rejected[0].levelno == logging.INFO, lines  # two groups, one line
    assert "is not one of this node's families" in rejected[0].getMessage()
    own_lines = [r.getMessage() for r in caplog.records if "failed on an own completion" in r.getMessage()]
    assert len([m for m in own_lines if "'junk_n@1'" in m and "score returned nan" in m]) == 1, own_lines


def test_eval_warns_when_a_family_without_split_key_has_swapped_twins_across_the_split(plugins: Path) -> None:
    """``swarm-node eval``'s check (``node.eval.split_leak_warnings``): gcd(a, b) evaluated while gcd(b, a) is a
    training question is one problem on two sides; a family with a ``split_key`` that folds the order keeps both on
    one side, and has no warning."""
    from node.eval import split_leak_warnings

    src = _source("pair_n", "keyed_pair_n", "echo_n", "chain_sum")
    test = {fam: [src.materialize(r) for r in refs] for fam, refs in src.split_refs("test", 20, 0).items()}
    warnings = split_leak_warnings(src, test, 0)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("task family 'pair_n@1' has no split_key") and "split_key" in warnings[0]
    # the keyed family's sides hold no swapped twins at all
    keys = {src.split_key(src.materialize(r)) for r in src.split_refs("train", 200, 0)["keyed_pair_n@1"]}
    assert not keys & {src.split_key(it) for it in test["keyed_pair_n@1"]}
