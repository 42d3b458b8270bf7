"""vf-sums: a single-turn verifiers (0.4, ``verifiers.v1``) environment whose data is local: add two numbers.

Its taskset generates its rows in ``load()`` from a fixed seed (no download), so it works offline. Each row asks for
the sum of two numbers; the rubric has two rewards, ``exact`` (weight 0.5: the answer between ``<answer>`` tags is
the sum) and ``close`` (weight 0.5: ``1 - |answer - sum| / sum``, at least 0), so a model that is nearly right earns
part of the reward.

Train on it in a swarm with ``tasks.families: [{name: "verifiers:vf_sums", config: {rows: 500}}]``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

import verifiers.v1 as vf

__all__ = ["SumsTaskset"]

_ANSWER = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)


def _answer(text: str) -> int | None:
    found = _ANSWER.findall(text)
    if not found:
        return None
    try:
        return int(found[-1].strip())
    except ValueError:
        return None


class SumsData(vf.TaskData):
    answer: str
    """The sum, in decimal."""


class SumsTask(vf.Task[SumsData]):
    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return 1.0 if _answer(trace.last_reply) == int(self.data.answer) else 0.0

    @vf.reward(weight=0.5)
    async def close(self, trace: vf.Trace) -> float:
        got, want = _answer(trace.last_reply), int(self.data.answer)
        if got is None:
            return 0.0
        return max(0.0, 1.0 - abs(got - want) / max(1, want))


class SumsConfig(vf.TasksetConfig):
    rows: int = 500
    """How many rows the taskset has."""
    max_value: int = 9
    """The largest addend."""


class SumsTaskset(vf.Taskset[SumsTask, SumsConfig]):
    def load(self) -> Iterable[SumsTask]:
        rng = random.Random(20260101)
        for i in range(self.config.rows):
            a, b = rng.randint(1, self.config.max_value), rng.randint(1, self.config.max_value)
            yield SumsTask(SumsData(id=f"sum-{i}", prompt=f"What is {a} + {b}?", answer=str(a + b)), self.config.task)
