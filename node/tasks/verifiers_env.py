"""A verifiers environment as a task family: ``tasks.families: [{name: "verifiers:<module>", config: {...}}]``.

verifiers (0.4, ``verifiers.v1``; Prime Intellect's library, the format of their Environments Hub) splits an
environment into a *taskset* (config in, tasks out: each task a row with a prompt and the data its rewards read) and
the agent that solves it. An installed package ``<module>`` that exports one ``vf.Taskset`` subclass in ``__all__``
is loaded with verifiers' own loader; ``config`` is validated by the taskset's config type.

* **Items** are the taskset's rows, addressed by their position in ``load()`` (the ref's ``index``; the task's own
  key is kept in the item's metadata as ``row_key``). The ref's ``seed`` does not change them: a dataset is what it
  is. The question is the row's prompt text (system prompt first, when it has one). Rows are read once per config
  (at most :data:`MAX_ROWS`) and kept.
* **Scores** come from the task's own ``@vf.reward`` functions, run on a trace holding one user turn and the
  completion as the one assistant reply (``trace.last_reply``): the weighted sum divided by the sum of the weights
  (so a rubric whose weights add up to 1 gives its own number), clamped to [0, 1].
* **Version**: the installed distribution's version of ``<module>``; a peer with another version drops the group.

Limits, each refused with one clear line at start-up:

* **offline only**: the rows must be local or generated. A taskset that reads a dataset from the Hugging Face hub
  fails (loading runs with ``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1``) and is refused naming the environment;
* **single-turn only**: a taskset that bundles its own harness (an agent program), an environment class other than
  the plain single-agent one, tool servers, stop conditions, judges (model calls), rewards that need a sandbox, or
  rows that need a container is refused until someone needs multi-turn: the node generates one reply per prompt.

Imports ``verifiers`` only when such a family is configured (the ``verifiers`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata as md
import inspect
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from node.tasks.family import VERSION_RE, TaskError, TaskItem, config_key
from protocol.types import Scalar

#: Rows read from one taskset at most (an infinite or huge taskset is cut here).
MAX_ROWS = 100_000
_HUB_HINTS = ("huggingface", "hf_hub", "hub", "offline", "connection", "couldn't reach", "could not reach")


def _refuse(module: str, why: str) -> TaskError:
    return TaskError(f"verifiers environment {module!r}: {why}", "task_unknown")


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Hub downloads fail at once: the environment variables for libraries imported from here on, and the module
    constants of those already imported (they read the variables at import)."""
    keys = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    patched: list[tuple[Any, str, Any]] = []
    for module, attr in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_DATASETS_OFFLINE"),
                         ("datasets.config", "HF_HUB_OFFLINE")):  # fmt: skip
        mod = sys.modules.get(module)
        if mod is not None and hasattr(mod, attr):
            patched.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, True)
    try:
        yield
    finally:
        for mod, attr, value in patched:
            setattr(mod, attr, value)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _distribution_version(module: str) -> str:
    top = module.split(".")[0]
    for dist in md.packages_distributions().get(top, []):
        with contextlib.suppress(md.PackageNotFoundError):
            version = md.version(dist)
            cleaned = re.sub(r"[^A-Za-z0-9_.+\-]", "_", version)[:31]
            if VERSION_RE.fullmatch(cleaned):
                return cleaned
    raise _refuse(module, "no installed distribution provides it (install its package, e.g. with pip), so it has no "
                          "version to put in task refs")  # fmt: skip


class VerifiersFamily:
    """A single-turn verifiers taskset as a family (module docstring). Not trusted: the node runs its code under the
    plug-in guard."""

    trusted = False

    def __init__(self, module: str, taskset_cls: Any, config_type: Any, version: str):
        self.module = module
        self.name = f"verifiers:{module}"
        self.version = version
        self._taskset_cls = taskset_cls
        self._config_type = config_type
        self._rows: OrderedDict[str, list[Any]] = OrderedDict()

    @classmethod
    def load(cls, module: str) -> VerifiersFamily:
        """Import the environment ``module`` and check it is single-turn; :class:`TaskError` saying why not."""
        try:
            from verifiers.v1 import Harness, SingleAgentEnv
            from verifiers.v1.utils import loaders
        except ImportError as e:
            raise _refuse(module, f"verifiers is not installed ({e}); pip install 'rl-swarm[verifiers]'") from e
        try:
            taskset_cls = loaders.taskset_class(module)
            config_type = loaders.taskset_config_type(module)
            env_cls = loaders.environment_class(module)
        except (ImportError, TypeError, AttributeError, ValueError) as e:
            raise _refuse(module, f"cannot load its taskset: {e}") from e
        if env_cls is not SingleAgentEnv:
            raise _refuse(module, f"its environment {env_cls.__name__} is not the plain single-agent one; only "
                                  "single-turn environments are supported")  # fmt: skip
        module_obj = loaders.import_taskset(module)
        bundled = [n for n in getattr(module_obj, "__all__", []) if _is_subclass(getattr(module_obj, n, None), Harness)]
        if bundled:
            raise _refuse(module, f"it bundles its own harness {bundled} (an agent program, multi-turn); only "
                                  "single-turn environments are supported")  # fmt: skip
        return cls(module, taskset_cls, config_type, _distribution_version(module))

    # ------------------------------------------------------------------ rows

    def _taskset(self, config: Mapping[str, Scalar]) -> Any:
        from pydantic import ValidationError

        try:
            cfg = self._config_type.model_validate({**dict(config), "id": self.module})
        except ValidationError as e:
            raise TaskError(f"task family {self.name!r}: invalid config {config_key(config)}: {e}") from e
        taskset = self._taskset_cls(cfg)
        if self._taskset_cls.toolsets(cfg):
            raise _refuse(self.module, "its taskset has tool servers (multi-turn); only single-turn is supported")
        return taskset

    def rows(self, config: Mapping[str, Scalar]) -> list[Any]:
        """The taskset's tasks under ``config`` (read once, at most :data:`MAX_ROWS`), each checked single-turn."""
        key = config_key(config)
        if key in self._rows:
            self._rows.move_to_end(key)
            return self._rows[key]
        taskset = self._taskset(config)
        rows: list[Any] = []
        try:
            with _offline():
                for task in taskset:
                    rows.append(task)
                    if len(rows) >= MAX_ROWS:
                        break
        except TaskError:
            raise
        except Exception as e:
            text = f"{type(e).__module__}.{type(e).__name__}: {e}".lower()
            if any(h in text for h in _HUB_HINTS):
                why = f"its dataset is not available offline ({type(e).__name__}: {e}); only environments whose data"
                raise _refuse(self.module, why + " is local or generated work here") from e
            raise _refuse(self.module, f"reading its rows failed: {e!r}") from e
        if not rows:
            raise _refuse(self.module, f"its taskset has no rows under config {key}")
        self._check_single_turn(rows[0])
        self._rows[key] = rows
        if len(self._rows) > 8:
            self._rows.popitem(last=False)
        return rows

    def _check_single_turn(self, task: Any) -> None:
        cls = type(task)
        why = []
        if getattr(cls, "NEEDS_CONTAINER", False):
            why.append("needs a container")
        if cls.toolsets(task.config):
            why.append("has tool servers")
        if task.hooks("stop"):
            why.append("has stop conditions")
        if task.config.judges:
            why.append("uses judges (model calls)")
        for fn in task.hooks("reward"):
            param = inspect.signature(fn).parameters.get("runtime")
            if param is not None and param.default is inspect.Parameter.empty:
                why.append(f"its reward {fn.__name__} needs a sandbox runtime")
        if why:
            raise _refuse(self.module, f"its task {cls.__name__} {', '.join(why)}; only single-turn environments "
                                       "are supported")  # fmt: skip

    # ------------------------------------------------------------------ the family interface

    def check_config(self, config: Mapping[str, Scalar]) -> None:
        self.rows(config)

    def size(self, config: Mapping[str, Scalar]) -> int:
        return len(self.rows(config))

    def generate(self, config: Mapping[str, Scalar], seed: int, index: int) -> dict[str, Any]:
        task = self.rows(config)[index]
        data = task.data
        prompt = data.prompt
        if prompt is not None and not isinstance(prompt, str):
            roles = {getattr(m, "role", None) for m in prompt}
            if not roles <= {"system", "user"}:
                why = f"row {index} has a conversation as its prompt (roles {sorted(map(str, roles))})"
                raise _refuse(self.module, why + "; only single-turn prompts are supported")
        question = "\n\n".join(t for t in (data.system_prompt, data.prompt_text) if t)
        answer = getattr(data, "answer", None)
        return {
            "question": question,
            "answer": answer if isinstance(answer, str) else None,
            "metadata": {"row_key": task.key, "row_id": data.id},
        }

    def score(self, item: TaskItem, completion: str) -> float:
        from verifiers.v1.configs.agent import AgentConfig
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask
        from verifiers.v1.types import AssistantMessage, UserMessage

        task = self.rows(item.ref.config)[item.ref.index]
        trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=AgentConfig()),
            nodes=[
                MessageNode(message=UserMessage(content=item.question)),
                MessageNode(parent=0, message=AssistantMessage(content=completion), sampled=True),
            ],
        )
        asyncio.run(task.score(trace))
        weights = [r.weight for r in trace.rewards.values() if r is not None]
        if len(weights) != len(trace.rewards) or not weights:
            raise TaskError(f"task family {self.name!r}: its rubric scored nothing ({trace.rewards})", "plugin_error")
        total = sum(w for w in weights if w > 0) or 1.0
        value = trace.reward / total
        return min(1.0, max(0.0, value)) if value == value else 0.0


def _is_subclass(obj: Any, base: type) -> bool:
    return isinstance(obj, type) and issubclass(obj, base) and obj is not base
