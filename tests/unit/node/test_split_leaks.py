"""No leak between the sides of the split (SPEC 13 v2) for anything this repository configures.

Training items are drawn through the code paths that train: RL draws (``TaskSource.sample``) of every task mix in
``configs/`` (node files and every node of every real-policy simulator experiment), the built-in model's warm start
(``node.model.tiny.sft_examples``) and the laboratory model's (``node.model.lab.training_examples``, its tokenizer's
corpus too) for the default recipes and every recipe those configs name, and
``model.warm_start`` items (``node.model.warm.items``) where a config has one. Evaluation items are what an
``Evaluator`` of each config reads on the test and on the dev side (``TaskSource.split_refs``). Problems are
compared by what the hash sees (``split_preimage``), so a chain_sum test problem that a basic_arithmetic prompt asks
word for word counts as a leak.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from node.config import NodeConfig, TaskConfig
from node.model import tiny
from node.tasks import PLAIN_TEMPLATE, Side, TaskSource, side_of_hash, split_key, split_preimage
from protocol.config import load_config
from protocol.types import TaskRef
from sim.config import load_sim_config

ROOT = Path(__file__).resolve().parents[3]
#: RL draws per family of each task mix, and warm-start examples per recipe (clean + noisy phase).
DRAWS_PER_FAMILY = 150
WARM_EXAMPLES = (1200, 400)


def configured_nodes() -> list[NodeConfig]:
    files = sorted((ROOT / "configs" / "node").glob("*.yaml")) + sorted((ROOT / "node" / "profiles").glob("*.yaml"))
    nodes = [load_config(NodeConfig, p) for p in files]
    for path in sorted((ROOT / "configs" / "sim").glob("*.yaml")):
        sim = load_sim_config(str(path))
        if sim.policy != "real":  # scripted families are not reasoning-gym items and have no split
            continue
        for variant in sim.configurations:
            for i in sorted({0, *sim.heterogeneity.node_overrides, *variant.node_overrides}):
                nodes.append(sim.node_config(variant.name, i, sim.seeds[0]))
    return nodes


T = TypeVar("T")


def _dedupe(values: list[T], key: Callable[[T], str]) -> list[T]:
    seen: dict[str, T] = {}
    for value in values:
        seen.setdefault(key(value), value)
    return list(seen.values())


@pytest.fixture(scope="module")
def nodes() -> list[NodeConfig]:
    found = configured_nodes()
    assert len(found) >= 5
    return found


def _tasks_id(cfg: TaskConfig) -> str:
    return json.dumps(cfg.model_dump(mode="json"), sort_keys=True)


def training_preimages(nodes: list[NodeConfig]) -> set[bytes]:
    out: set[bytes] = set()
    for tasks in _dedupe([n.tasks for n in nodes], _tasks_id):
        src = TaskSource(tasks)
        for ref in src.sample(random.Random(0), DRAWS_PER_FAMILY * len(src.families)):
            out.add(split_preimage(ref.family, src.materialize(ref).question))
    recipes = [tiny.DEFAULT_RECIPE] + [
        tiny.recipe_with(n.model.builtin) for n in nodes if n.model.name == "builtin:tiny"
    ]
    prefix, suffix = PLAIN_TEMPLATE.split("{question}")
    for recipe in _dedupe(recipes, lambda r: r.key()):
        families = [f.name for f in recipe.sft_families]
        clean, noisy = WARM_EXAMPLES
        pairs = tiny.sft_examples(recipe, clean, 1.0, salt=1)
        pairs += tiny.sft_examples(recipe, noisy, recipe.correct_fraction, salt=2)
        for prompt, _ in pairs:
            question = prompt.removeprefix(prefix).removesuffix(suffix)
            out.update(split_preimage(f, question) for f in families)  # the prompt does not name its family
    from node.model import lab

    lab_recipes = [lab.DEFAULT_LAB_RECIPE] + [
        lab.recipe_with(n.model.builtin) for n in nodes if n.model.name == lab.LAB_NAME
    ]
    for recipe in _dedupe(lab_recipes, lambda r: r.key()):  # its tokenizer's corpus and its warm start
        for families, salt in ((lab.lab_task_families(), 0), (recipe.families, 1)):
            for prompt, _ in lab.training_examples(recipe, families, WARM_EXAMPLES[0], salt, trace=False):
                question = prompt.removeprefix(prefix).removesuffix(suffix)
                out.update(split_preimage(f.name, question) for f in families)
    warm_starts = [n.model.warm_start for n in nodes if n.model.warm_start is not None]
    if warm_starts:
        from node.model import warm

        for ws in _dedupe(warm_starts, lambda w: json.dumps(w.model_dump(mode="json"), sort_keys=True)):
            for item in warm.items(ws.model_copy(update={"examples": min(ws.examples, 1000)})):
                out.add(split_preimage(item.ref.family, item.question))
    return out


def evaluation_preimages(nodes: list[NodeConfig], side: Side) -> dict[bytes, str]:
    out: dict[bytes, str] = {}
    by_mix = _dedupe(nodes, lambda n: _tasks_id(n.tasks) + json.dumps([n.eval.seed, n.eval.items_per_family]))
    for node in by_mix:
        src = TaskSource(node.tasks)
        for family, refs in src.split_refs(side, node.eval.items_per_family, node.eval.seed).items():
            for ref in refs:
                question = src.materialize(ref).question
                out[split_preimage(family, question)] = f"{family}: {question}"
    return out


def test_no_dev_or_test_problem_is_ever_trained_on(nodes: list[NodeConfig]) -> None:
    train = training_preimages(nodes)
    assert len(train) > 3000
    sides: tuple[Side, ...] = ("test", "dev")
    for side in sides:
        held = evaluation_preimages(nodes, side)
        assert len(held) > 500, side
        leaks = sorted(held[p] for p in held.keys() & train)
        assert not leaks, (side, leaks[:5])


def test_a_family_scoped_hash_would_leak() -> None:
    """Teeth: had the hash kept the family (split v1), chain_sum test problems would be basic_arithmetic training
    problems. The defaults of the two families share many problems, and a family-scoped line cuts them apart."""
    families = {f.name: f for f in TaskConfig().families}

    def scoped_sides(name: str) -> dict[str, str]:
        src = TaskSource(TaskConfig(families=[families[name]]))
        sides = {}
        for index in range(2000):
            ref = TaskRef(family=name, config=families[name].config, seed=0, index=index)
            key = split_key(name, src.materialize(ref).question)
            digest = hashlib.sha256(name.encode() + b"\0" + key.encode()).digest()
            sides[key] = side_of_hash(int.from_bytes(digest[:8], "big"), 0.1, 0.1)
        return sides

    chain, arith = scoped_sides("chain_sum"), scoped_sides("basic_arithmetic")
    leaked = [k for k, side in chain.items() if side == "test" and arith.get(k) == "train"]
    assert leaked, "the two default families no longer share problems: this test lost its teeth"
