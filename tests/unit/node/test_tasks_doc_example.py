"""docs/tasks.md's example is the package in examples/gcd_task, verbatim, and it works as the page says.

The page shows each file of the package in a fenced block right after a line naming the file (`` `path`: ``); the
test compares each block with the file byte for byte, checks every file of the package is shown, then installs the
package the way pip leaves it (a ``*.dist-info`` with the entry points of its ``pyproject.toml``) and uses it through
the node's task source: the interface, the entry point, the version on the wire, the up-front config check and the
split key that keeps gcd(a, b) and gcd(b, a) on one side.
"""

from __future__ import annotations

import random
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from node.config import TaskConfig, TaskFamily
from node.tasks import TaskSource, registry
from protocol.types import TaskRef

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "tasks.md"
PACKAGE = REPO / "examples" / "gcd_task"
_BLOCK = re.compile(r"^`(examples/[^`]+)`:\n\n```[a-z]*\n(.*?)^```$", re.M | re.S)


def shown_files() -> dict[str, str]:
    """``path -> text`` of every file block in the page."""
    return {path: text for path, text in _BLOCK.findall(DOC.read_text())}


def test_the_doc_shows_every_file_of_the_example_verbatim() -> None:
    shown = shown_files()
    files = sorted(
        str(p.relative_to(REPO))
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
    )
    assert sorted(shown) == files
    for path, text in shown.items():
        assert text == (REPO / path).read_text(), f"docs/tasks.md's copy of {path} differs from the file"


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The example package on ``sys.path`` with the entry points its pyproject.toml declares."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE / "gcd_task", site / "gcd_task")
    meta = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    info = site / "gcd_task-1.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    eps = meta["entry-points"]["rl_swarm.tasks"]
    (info / "entry_points.txt").write_text("[rl_swarm.tasks]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    yield
    sys.modules.pop("gcd_task", None)


def test_the_example_family_works_in_a_node(installed: None) -> None:
    import math

    registry.check_families([TaskFamily(name="gcd_pair", config={"max_value": 60})])
    src = TaskSource(TaskConfig(families=[{"name": "gcd_pair", "config": {"max_value": 60}}]))
    assert src.families == ["gcd_pair@1"]  # the version, a string, on the wire
    refs = src.sample(random.Random(0), 16)
    for ref in refs:
        item = src.materialize(ref)
        a, b = item.metadata["a"], item.metadata["b"]
        assert item.question == f"What is the greatest common divisor of {a} and {b}?"
        assert item.answer == str(math.gcd(a, b)) and src.side(item) == "train"
        assert src.score(item, f"I think <answer>{item.answer}</answer>") == 1.0
        assert src.score(item, f"<answer>{item.answer}</answer> no, <answer>{int(item.answer) + 1}</answer>") == 0.0
        assert src.score(item, "no tags") == 0.0
        trace = src.trace(item)
        assert trace.startswith("<think>") and trace.endswith(f"<answer>{item.answer}</answer>")
        assert src.score(item, trace) == 1.0
    # the split key folds the order: both wordings of one problem lie on one side
    item = src.materialize(refs[0])
    a, b = item.metadata["a"], item.metadata["b"]
    swapped = item.question.replace(f"of {a} and {b}", f"of {b} and {a}")
    assert src.split_key(item) == src.split_key(type(item)(ref=item.ref, question=swapped, answer=item.answer))
    test_items = [src.materialize(r) for r in src.split_refs("test", 30, 0)["gcd_pair@1"]]
    train_keys = {src.split_key(src.materialize(r)) for r in src.split_refs("train", 300, 0)["gcd_pair@1"]}
    assert test_items and not train_keys & {src.split_key(it) for it in test_items}
    # a peer's ref regenerates the same item; another config or version is refused by reason
    assert src.materialize(TaskRef(**refs[0].to_dict())).question == item.question
    other = src.refusal(TaskRef(family="gcd_pair@1", config={"max_value": 100}, seed=0, index=1))
    assert other.reason == "task_rejected"
    assert src.refusal(TaskRef(family="gcd_pair@2", config={"max_value": 60}, seed=0, index=1)).reason == "task_version"


def test_the_example_refuses_a_bad_config_up_front(installed: None) -> None:
    from node.tasks.family import FamilyConfigError

    with pytest.raises(FamilyConfigError) as e:
        registry.check_families(
            [TaskFamily(name="gcd_pair", config={"max_value": 1}), TaskFamily(name="gcd_pair", config={"top": 5})]
        )
    assert e.value.problems == [
        "task family 'gcd_pair': check_config({\"max_value\":1}) refused it: max_value must be between 2 and 1000000",
        "task family 'gcd_pair': check_config({\"top\":5}) refused it: unknown keys ['top']; gcd_pair takes max_value",
    ]
    # the page's sample error line is this message
    assert f"error: {e.value.problems[0]}" in DOC.read_text()
