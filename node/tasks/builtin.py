"""The built-in families as users of the plug-in interface: reasoning-gym datasets and the laboratory families.

:class:`GymFamily` adapts one reasoning-gym dataset (SPEC 13): item ``index`` of task seed ``seed`` is
``create_dataset(name, size=DEFAULT_SIZE, **config, seed=seed)[index]`` (reasoning-gym seeds each item from
``seed + index``), scored by the dataset's own ``score_answer`` on the extracted answer, clamped to [0, 1] (NaN and
a raising verifier: 0). :class:`LabFamily` is the same for ``lab_add``/``lab_sub`` (``node.arith`` registers them
with reasoning-gym) and adds their written working (``trace``). Both are unversioned (``version == ""``): SPEC 13 and
reasoning-gym 0.1.25 define their items, so their refs keep the bare name on the wire.

Trusted (``trusted = True``): the node calls them directly, without the plug-in guard's thread and time limit.
"""

from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from node.arith import LAB_FAMILIES, completion_for, lab_dataset, register_with_reasoning_gym
from node.tasks.answer import extract_answer
from node.tasks.family import TaskError, TaskItem, config_key
from protocol.types import Scalar

#: Virtual dataset size (upper bound on item indices) when a family's config does not set ``size``.
DEFAULT_SIZE = 1_000_000_000


def _datasets() -> dict[str, Any]:
    """reasoning-gym's registry, the laboratory families in it (imported on first use: about 4.5 s of CPU)."""
    with contextlib.redirect_stdout(io.StringIO()):  # its bf dataset prints a row of dots on import
        import reasoning_gym  # noqa: F401  (registers the datasets)
    from reasoning_gym.factory import DATASETS

    register_with_reasoning_gym()
    return DATASETS  # type: ignore[no-any-return]


class GymFamily:
    """One reasoning-gym dataset as a family (module docstring)."""

    version = ""
    trusted = True

    def __init__(self, name: str, *, cache: int = 64):
        self.name = name
        self._cache: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._cache_size = cache

    def dataset(self, config: Mapping[str, Scalar], seed: int) -> Any:
        """The reasoning-gym dataset of ``config`` under task seed ``seed`` (cached); :class:`TaskError` for a config
        it refuses."""
        key = (config_key(config), seed)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        kwargs = {"size": DEFAULT_SIZE, **config, "seed": seed}
        try:
            dataset = self._create(kwargs)
        except (TypeError, ValueError, AssertionError) as e:
            raise TaskError(f"task family {self.name!r}: invalid config {config_key(config)}: {e}") from e
        self._cache[key] = dataset
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return dataset

    def _create(self, kwargs: dict[str, Any]) -> Any:
        _datasets()
        import reasoning_gym

        return reasoning_gym.create_dataset(self.name, **kwargs)

    def check_config(self, config: Mapping[str, Scalar]) -> None:
        self.dataset(config, 0)

    def size(self, config: Mapping[str, Scalar], seed: int = 0) -> int:
        return int(self.dataset(config, seed).size)

    def generate(self, config: Mapping[str, Scalar], seed: int, index: int) -> dict[str, Any]:
        dataset = self.dataset(config, seed)
        with contextlib.redirect_stdout(io.StringIO()):  # some generators print progress dots to stdout
            entry = dataset[index]
        answer = entry.get("answer")
        return {
            "question": entry["question"],
            "answer": None if answer is None else str(answer),
            "metadata": entry.get("metadata", {}),
        }

    def score(self, item: TaskItem, completion: str) -> float:
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        dataset = self.dataset(item.ref.config, item.ref.seed)
        entry = {"question": item.question, "answer": item.answer, "metadata": item.metadata}
        try:
            reward = float(dataset.score_answer(answer, entry))
        except Exception:  # a verifier crashing on garbage text is a wrong answer, not a node failure
            return 0.0
        return min(1.0, max(0.0, reward)) if reward == reward else 0.0


class LabFamily(GymFamily):
    """``lab_add`` / ``lab_sub`` (``node.arith``): a reasoning-gym family with written working, made without
    importing reasoning-gym (:class:`node.arith.LabDataset`: the same items)."""

    def _create(self, kwargs: dict[str, Any]) -> Any:
        return lab_dataset(self.name, **kwargs)

    def trace(self, item: TaskItem) -> str:
        """The gold completion with its working first: ``<think>...</think><answer>gold</answer>``."""
        return completion_for(item.metadata)


def builtin_family(name: str) -> GymFamily | None:
    """The built-in family ``name``, or None when it is neither a laboratory family nor a reasoning-gym dataset."""
    if name in LAB_FAMILIES:
        return LabFamily(name)
    if name in _datasets():
        return GymFamily(name)
    return None
