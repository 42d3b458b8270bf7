"""verifiers environments as task families (``node.tasks.verifiers_env``): the example works; multi-turn and hub-only
environments are refused with one clear line each.

Each environment here is an installed distribution as far as ``importlib.metadata`` can tell (a ``*.dist-info``
with ``top_level.txt`` beside its module on ``sys.path``), so its version is the distribution's.
"""

from __future__ import annotations

import random
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from node.config import TaskConfig
from node.tasks import TaskError, TaskSource, registry

ROOT = Path(__file__).resolve().parents[3]

COMMON = """
import verifiers.v1 as vf


class Data(vf.TaskData):
    answer: str


class Plain(vf.Task[Data]):
    @vf.reward
    async def right(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply == f"<answer>{self.data.answer}</answer>" else 0.0
"""

MODULES = {
    "vf_agentic": COMMON
    + """
__all__ = ["Rows", "MyHarness"]


class MyHarness(vf.Harness):
    pass


class Rows(vf.Taskset[Plain, vf.TasksetConfig]):
    def load(self):
        yield Plain(Data(prompt="Say 1.", answer="1"), self.config.task)
""",
    "vf_stops": COMMON
    + """
__all__ = ["Rows"]


class Stops(Plain):
    @vf.stop
    async def enough(self, trace: vf.Trace) -> bool:
        return True


class Rows(vf.Taskset[Stops, vf.TasksetConfig]):
    def load(self):
        yield Stops(Data(prompt="Say 1.", answer="1"), self.config.task)
""",
    "vf_hub": COMMON
    + """
__all__ = ["Rows"]


class Rows(vf.Taskset[Plain, vf.TasksetConfig]):
    def load(self):
        import huggingface_hub

        path = huggingface_hub.hf_hub_download("someone/some-dataset", "train.jsonl", repo_type="dataset")
        for line in open(path):
            yield Plain(Data(prompt=line, answer="1"), self.config.task)
""",
}


def _install(site: Path, module: str, source: str | None = None, version: str = "0.3.0") -> None:
    if source is None:
        (site / module).write_text("")
    else:
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(module + "\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    for module, source in MODULES.items():
        _install(site, module, source)
    shutil.copytree(ROOT / "examples" / "vf_sums" / "vf_sums", site / "vf_sums")
    info = site / "vf_sums-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vf-sums\nVersion: 0.1.0\n")
    (info / "top_level.txt").write_text("vf_sums\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    yield site
    for module in [*MODULES, "vf_sums"]:
        sys.modules.pop(module, None)


def _source(name: str, **config) -> TaskSource:
    return TaskSource(TaskConfig(families=[{"name": name, "config": config}]))


def test_a_single_turn_environment_is_a_family(site: Path) -> None:
    src = _source("verifiers:vf_sums", rows=60)
    assert src.families == ["verifiers:vf_sums@0.1.0"]  # the distribution's version travels in the ref
    ref = src.sample(random.Random(0), 1)[0]
    item = src.materialize(ref)
    assert item.question.startswith("What is ") and item.answer is not None
    assert item.metadata["row_id"] == f"sum-{ref.index}"  # rows addressed by their position in load()
    assert src.score(item, f"<answer>{item.answer}</answer>") == 1.0  # both rewards, weights 0.5 + 0.5
    wrong = str(int(item.answer) + 1)
    expected_close = 0.5 * (1 - 1 / int(item.answer))
    assert src.score(item, f"<answer>{wrong}</answer>") == pytest.approx(expected_close)
    assert src.score(item, "no answer") == 0.0
    with pytest.raises(TaskError) as e:  # beyond the rows: refused, not generated
        src.materialize(ref.__class__(family=ref.family, config=dict(ref.config), seed=0, index=60))
    assert e.value.reason == "task_rejected"
    with pytest.raises(TaskError, match="invalid config"):
        _source("verifiers:vf_sums", rows="many")


@pytest.mark.parametrize(
    ("module", "why"),
    [
        ("vf_agentic", r"bundles its own harness \['MyHarness'\].*only single-turn"),
        ("vf_stops", r"has stop conditions; only single-turn"),
        ("vf_hub", r"verifiers environment 'vf_hub': its dataset is not available offline .*local or generated"),
        ("vf_not_installed", r"verifiers environment 'vf_not_installed': cannot load its taskset"),
    ],
)
def test_environments_this_node_cannot_train_on_are_one_clear_error(site: Path, module: str, why: str) -> None:
    with pytest.raises(TaskError, match=why):
        _source(f"verifiers:{module}")
