"""A learning experiment's pre-registration as data: the ``registration:`` block of a ``configs/sim/*.yaml``.

The block states, before any result exists, what the experiment asks and how its answer will be read: the arms
and their roles, the seeds, the metrics (the first is the primary), the side and readout step, the paired
analysis, the comparisons reported and the target rule. The rest of the YAML (nodes, steps, the arms' node
settings) is the setting; :func:`registration_hash` covers both, so a changed rate, readout or target after a
result exists is a different registration. The experiment driver (``sim.driver``) refuses to add to or re-read
results made under another hash unless the change is recorded as a dated :class:`Amendment` naming the hash it
replaces; the report prints every amendment.

Only pydantic (no torch, no git): a registration validates with its experiment. Knows nothing about running.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from typing import Any, Literal

from pydantic import Field, model_validator

from protocol.config import StrictModel

#: Top-level experiment keys that choose how a registered experiment runs, never what it measures.
RUN_KEYS = ("seeds", "workers", "quick")
#: Registration keys that record its history rather than define it.
HISTORY_KEYS = ("amendments", "registered")
#: The pseudo-arm every arm can be compared with: its own step-0 value, seed by seed (the gain over its start).
START = "start"


class RegisteredArm(StrictModel):
    """One arm: a configuration of the experiment (its ``configurations`` entry of the same name)."""

    role: Literal["control", "treatment", "reference", "ceiling"]
    """``treatment``: an arm the target may be met by; ``control``: an arm it must beat; ``reference`` and
    ``ceiling``: reported beside the verdict, never in it (a ceiling is what no swarm can pass, e.g. a node's own
    reference traces)."""
    note: str = ""
    """Why the arm is there (printed in the report)."""


class MetricSpec(StrictModel):
    """A per-seed number read from every node's held-out evaluations (``eval.jsonl``)."""

    hook: str = "exact"
    """How the number is computed, by name (``sim.driver.metrics.METRICS``): ``exact`` (the mean of ``key`` over
    the ``part``'s (node, family) cells), ``gap_closed`` (``(end - start) / (peer level - start)`` on each measured
    node's ``lacking`` family, the peer level being the step-0 ``key`` of the nodes whose ``known`` family it is;
    mean over the measured nodes), ``over_baseline`` (the part's ``accuracy`` less its ``majority_baseline``). A new
    experiment may add one hook."""
    part: str = "all"
    """Which (node, family) cells: ``all`` (every family of every measured node) or a name in ``parts``."""
    key: str = "accuracy"
    """The evaluation field: ``accuracy`` (exact, mean over samples), ``pass_at_8``, ``majority_baseline``,
    ``greedy_accuracy`` (``sim.driver.records.RECORDED``)."""
    gain: bool = False
    """The change from the pair's step 0 (0 at step 0): a gain compared across arms, or held to a level."""
    no_gap: Literal["undefined", "left_out"] = "undefined"
    """``gap_closed`` only: a node whose peers start no better than it on its lacking family has no gap to close.
    ``undefined``: the pair's number is NaN (so is every mean over seeds that holds it); ``left_out``: the mean is over
    the measured nodes that have a gap (NaN only when none has). Which nodes have a gap is fixed by a pair's step-0
    evaluation: the seed's shared start for every arm that shares it (``sim.driver.start.sharing_arms``), an arm's own
    sampled start otherwise."""
    text: str = ""
    """What the number is, for the report."""


class Condition(StrictModel):
    """One condition of the target: exactly one of ``beats``, ``at_least``, ``at_most``."""

    metric: str | None = None
    """A name in ``metrics``; the primary (the first) when unset."""
    arm: str | None = None
    """The arm the condition is about; the candidate arm (one of the target's ``arms``) when unset."""
    beats: str | list[str] | None = None
    """The control the arm must beat: the lower end of the paired interval of (arm - control) above ``above``. A list
    is the better of them (the higher mean over the seeds), e.g. alone at the shared rate and at its own best rate.
    ``start`` is the arm's own step-0 value, seed by seed: the gain over its start (a single-arm experiment)."""
    above: float = 0.0
    """The margin ``beats`` asks of the interval's lower end (-0.01: "not worse than by more than 0.01")."""
    at_least: float | None = None
    """The arm's mean over seeds at least this (e.g. a gap closed of 0.5)."""
    at_most: float | None = None
    """The arm's mean over seeds at most this (e.g. alone closing at most 0.05)."""
    share_of: str | None = None
    """With ``at_least`` / ``at_most``: the bound is on the arm's mean as a share of this arm's mean (e.g. bare
    answers at most half of what traces reach)."""

    @model_validator(mode="after")
    def _one(self) -> Condition:
        given = [k for k in ("beats", "at_least", "at_most") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a target condition needs exactly one of beats, at_least, at_most; got {given or 'none'}")
        if self.share_of is not None and self.beats is not None:
            raise ValueError("share_of bounds a level (at_least or at_most), not a comparison (beats)")
        return self


class Target(StrictModel):
    """The registered rule: met when one of ``arms`` meets every condition."""

    arms: list[str] = Field(min_length=1)
    """Candidate arms (treatments); the verdict names each that meets every condition."""
    all: list[Condition] = Field(min_length=1)
    """Conditions, all of which must hold for a candidate."""
    text: str = ""
    """The rule in words, for the report."""
    beside: list[str] = Field(default_factory=list)
    """Treatments the same rule is also read for, reported beside the verdict and never in it: arms added by
    amendment after a test-side number of the experiment was read, so a reader sees how they fare without a late
    arm changing the registered answer."""


class Analysis(StrictModel):
    """How arms are compared."""

    paired: Literal["seed"] = "seed"
    """Arms are paired by seed: a seed gives every arm the same initial models and task draws."""
    interval: Literal["t95", "sd2"] = "t95"
    """``t95``: the two-sided 95% Student-t interval of the per-seed differences; ``sd2``: their mean ± 2 sd (the
    rule "beyond 2 sd" that B6 and B7 registered before the driver used t intervals)."""


class Amendment(StrictModel):
    """A dated change to a registration after it was first registered."""

    date: dt.date
    """When the change was written."""
    change: str = Field(min_length=1)
    """What changed and why, and what had been read when it was written."""
    before: str | None = None
    """The registration hash the change replaced; results made under it stay valid. None for a change written
    before registrations were hashed (kept as history)."""


class Provenance(StrictModel):
    """Where a registration was first written, when that was before it was data (a docstring, say)."""

    commit: str = Field(min_length=7)
    """The commit that first held the registration."""
    date: dt.date
    """That commit's date."""
    where: str
    """The file that held it."""


class Registration(StrictModel):
    """An experiment's pre-registration (the ``registration:`` block of its YAML)."""

    question: str = Field(min_length=1)
    """What the experiment asks."""
    results: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Stem of the results files, ``benchmarks/results/<results>.md`` / ``.json`` / ``.png``."""
    setting: str = ""
    """The setting's name (e.g. ``het``), for the report."""
    arms: dict[str, RegisteredArm] = Field(min_length=1)
    """Arm name (a configuration of the experiment) -> role; the order is the report's."""
    seeds: list[int] = Field(min_length=1)
    """The registered seeds; the verdict is final once every arm has all of them (``beats`` needs two)."""
    per_seed: list[str] = Field(default_factory=list)
    """Dotted experiment paths set to the run's seed in every arm (``node.model.builtin.seed``): the warm start is
    drawn per seed, so the interval covers warm starts too. Empty: every seed starts from the same models."""
    side: Literal["test", "dev"] = "test"
    """The held-out side read (the nodes' ``eval.side`` must agree)."""
    readout: int | Literal["final"] = "final"
    """The evaluation step read as the result (``final``: the experiment's ``steps``)."""
    measured: list[int] | None = None
    """The nodes whose numbers are the result (default every node; teachers may be left out)."""
    parts: dict[str, dict[int, str]] = Field(default_factory=dict)
    """Named (node -> family) maps, e.g. ``lacking`` and ``known``; a metric's ``part`` picks one."""
    metrics: dict[str, MetricSpec] = Field(min_length=1)
    """Name -> metric; the first is the primary metric."""
    baseline: str | None = "majority_baseline"
    """An evaluation field printed beside the results as what any skill must beat (None: none)."""
    analysis: Analysis = Field(default_factory=Analysis)
    """Pairing and interval."""
    comparisons: list[tuple[str, str]] = Field(default_factory=list)
    """(arm, control) pairs reported, besides those the target reads."""
    target: Target
    """The registered verdict rule."""
    registered: Provenance | None = None
    """Set only when the registration was written before it was data; otherwise the driver finds the first commit of
    the YAML that holds it (git history)."""
    amendments: list[Amendment] = Field(default_factory=list)
    """Dated changes after registration, oldest first."""

    @model_validator(mode="after")
    def _check(self) -> Registration:
        arms = set(self.arms)
        both = sorted(set(self.target.arms) & set(self.target.beside))
        if both:
            raise ValueError(f"target arms {both} are both candidates and read beside the verdict: choose one")
        named = [*self.target.arms, *self.target.beside, *(a for pair in self.comparisons for a in pair)]
        for c in self.target.all:
            named += [c.arm] if c.arm else []
            named += [c.share_of] if c.share_of else []
            named += [c.beats] if isinstance(c.beats, str) else list(c.beats or [])
            if c.metric is not None and c.metric not in self.metrics:
                raise ValueError(f"target condition names metric {c.metric!r}; registered: {sorted(self.metrics)}")
        if START in arms:
            raise ValueError(f"{START!r} is the pseudo-arm of every arm's own start; name the arm otherwise")
        unknown = sorted({a for a in named if a not in arms and a != START})
        if unknown:
            raise ValueError(f"registration names arms {unknown} that are not in its arms {sorted(arms)}")
        for name, m in self.metrics.items():
            if m.part != "all" and m.part not in self.parts:
                raise ValueError(f"metric {name!r} reads part {m.part!r}; declare it in parts ({sorted(self.parts)})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("registration seeds must be distinct")
        return self

    @property
    def primary(self) -> str:
        return next(iter(self.metrics))

    def accepted_hashes(self, current: str) -> set[str]:
        """Hashes whose results stay valid under this registration: the current one and every amended one."""
        return {current, *(a.before for a in self.amendments if a.before)}


def registration_hash(mapping: dict[str, Any]) -> str:
    """The hash of a registered experiment as written (its YAML mapping after any ``--quick`` and ``--set``): the
    registration without its history, and the setting without the keys that only choose how it runs (which seeds
    run now, workers, the quick overrides). Computed on the mapping, not the validated model, so a new default in
    the code does not change it (the driver's per-arm keys catch those and rerun the pairs)."""
    data = {k: copy.deepcopy(v) for k, v in mapping.items() if k not in RUN_KEYS}
    reg = data.get("registration") or {}
    data["registration"] = {k: v for k, v in reg.items() if k not in HISTORY_KEYS}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
