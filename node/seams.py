"""The typed seams of a node: what the runtime needs from its policy, rollout engine, task source and learner.

Each is a :class:`typing.Protocol`, satisfied structurally by the real parts (``node.model.policy.Policy``,
``node.rollout.engine.TransformersEngine`` / the vLLM engine, ``node.tasks.TaskSource``,
``node.learn.learner.Learner``) and by the simulator's scripted stand-ins (``sim.scripted``), so mypy checks both
against one description and a reader sees the path a step takes without opening the implementations.

:class:`TrainSample` is the one concrete type here: what crosses the learner seam.

Knows nothing about how any part works; imports nothing heavy.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from protocol.types import Envelope, Group, TaskRef

if TYPE_CHECKING:
    from node.tasks import TaskItem


BEHAVIOUR_LOGPROB_FLOOR = -20.0
"""Peers' behaviour logprobs (per token or a mean) are clamped to ``[BEHAVIOUR_LOGPROB_FLOOR, 0]`` wherever they are
read: a logprob is never positive, and below about -20 (probability 2e-9) a hint carries no information, only
leverage over the importance weight."""


@dataclass(frozen=True)
class GenerationSettings:
    """How a node's rollout engine samples, fixed when the engine is built (from the ``rollout`` config section).

    The planner, APRIL and the MNPO phase all sample with these; only the held-out evaluator asks for other values
    (greedy decoding, its own token budget), per call."""

    max_new_tokens: int = 32
    """Token budget of one completion."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("need max_new_tokens >= 1, temperature >= 0 and 0 < top_p <= 1")

    @classmethod
    def of(cls, rollout: Any) -> GenerationSettings:
        """The settings of a ``RolloutConfig``."""
        return cls(max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature, top_p=rollout.top_p)

    def resolve(
        self, max_new_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None
    ) -> GenerationSettings:
        """These settings with a call's overrides applied, checked as the settings themselves are."""
        return replace(
            self,
            max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p if top_p is None else top_p,
        )


@dataclass
class TrainSample:
    """One scored completion, ready for the learner."""

    prompt_ids: list[int]
    """Prompt tokens (local tokenizer)."""
    completion_ids: list[int]
    """Completion tokens (local tokenizer); the loss covers these only."""
    advantage: float
    """Group-relative advantage of this completion."""
    behaviour_logprobs: list[float] | None = None
    """Per-token logprobs of the policy that sampled the completion (local rollouts), one per completion token."""
    behaviour_logprob_mean: float | None = None
    """Mean per-token behaviour logprob, an untrusted hint a peer may send with its rollouts."""
    external: bool = False
    """True for a peer's completion (its behaviour information is untrusted and clamped)."""
    guided: bool = False
    """Train it as off-policy guidance (``sapo.peer_advantage: guided``): LUFFY's shaped term, no clip, no
    importance weight (``node.learn.losses.policy_gradient_loss``)."""
    family: str = ""
    """The task family of a peer's completion, for the learner's per-family peer metrics ("" for own samples)."""
    right: bool = False
    """One of this node's own completions that its verifier scored right (the trace step's anchor states,
    ``learner.trace_anchor``)."""
    trace: bool = False
    """A verified worked solution (a guided peer completion this node scored right, or a ``labels.trace`` generator
    trace): the learner's separate trace step (``learner.trace_lr``) imitates it."""
    trace_only: bool = False
    """A ``sapo.trace_groups`` trace: trained by the trace step only, never by the RL update."""
    own_solve: float | None = None
    """For a guided peer's trace: the share of this node's own ``G`` completions of the same prompt that its verifier
    scored right (``learner.trace_max_own_solve`` keeps the traces of prompts the node fails); None otherwise."""
    source: str = ""
    """For a guided peer's trace: the peer that published it ("" for this node's own and generator rows). The trace
    step's replay shares its slots between sources by the groups each contributed, not by its distinct texts
    (``Learner.select_traces``)."""


class Generation(Protocol):
    """One sampled completion as the runtime reads it from an engine."""

    @property
    def text(self) -> str: ...
    @property
    def prompt_ids(self) -> list[int]: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float]: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def policy_version(self) -> int: ...


class PolicyLike(Protocol):
    """A loaded model's prompt format and tokenizer (the model itself is the learner's business)."""

    @property
    def tokenizer(self) -> Any: ...  # ``eos_token_id`` and ``pad_token_id`` are read from it
    @property
    def tokenizer_id(self) -> str: ...
    def format_prompt(self, question: str) -> str: ...
    def encode(self, text: str) -> list[int]: ...


class EngineLike(Protocol):
    """Samples ``n`` completions per prompt with its :class:`GenerationSettings` (a call may override them) and tags
    each with the policy version it was told."""

    @property
    def settings(self) -> GenerationSettings: ...
    def generate(
        self,
        prompts: list[str],
        n: int,
        /,
        *,
        seed: int | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> Sequence[Sequence[Generation]]: ...
    @property
    def policy_version(self) -> int: ...  # the version of the weights it samples with
    def set_policy_version(self, version: int) -> None: ...  # the learner stepped (an engine with a copy may sync)
    def sync_weights(self, version: int) -> None: ...  # the learner's weights changed: sample with them from now
    def stats(self) -> dict[str, float]: ...  # ``engine_*`` fields of the step's metrics line ({} if none)


class TasksLike(Protocol):
    """Task items addressed by :class:`TaskRef`: draw, regenerate, verify."""

    @property
    def families(self) -> list[str]: ...
    def sample(self, rng: random.Random, n: int) -> list[TaskRef]: ...
    def materialize(self, ref: TaskRef) -> TaskItem: ...
    def materialize_for_training(self, ref: TaskRef) -> TaskItem: ...
    def accepts(self, ref: TaskRef) -> bool: ...
    def score(self, item: TaskItem, completion_text: str, *, own: bool = True) -> float: ...
    def trace(self, item: TaskItem) -> str | None: ...
    def warn_if_small(self, total_draws: int) -> list[str]: ...
    def metrics(self) -> dict[str, Any]: ...  # plug-in failures and quarantines for the metrics line ({} if none)


class LearnerLike(Protocol):
    """Owns the policy's weights: one update per :meth:`step`, and the version that counts updates."""

    policy_version: int

    def step(self, samples: list[TrainSample]) -> dict[str, float]: ...


class StepPhase(Protocol):
    """A second learning phase that runs beside the node's GRPO/SAPO step (MNPO, ``node.mnpo.phase``).

    The runtime calls it at fixed points of every step: ``generate`` after its own generation (blocking),
    ``runs_grpo`` to learn whether the GRPO/SAPO update runs this step, ``take_groups``/``publish`` when it
    publishes, ``ingest`` for each validated envelope, ``train`` after its own update (blocking), and ``metrics``
    for the step's metrics line.
    """

    def generate(self, step: int) -> None: ...
    def runs_grpo(self, step: int) -> bool: ...
    def take_groups(self) -> list[Group]: ...
    async def publish(self) -> None: ...
    def ingest(self, env: Envelope) -> None: ...
    def train(self) -> dict[str, float]: ...
    def metrics(self) -> dict[str, Any]: ...


class NoPhase:
    """The :class:`StepPhase` of a node that runs GRPO/SAPO alone: every hook does nothing."""

    def generate(self, step: int) -> None:
        return None

    def runs_grpo(self, step: int) -> bool:
        return True

    def take_groups(self) -> list[Group]:
        return []

    async def publish(self) -> None:
        return None

    def ingest(self, env: Envelope) -> None:
        return None

    def train(self) -> dict[str, float]:
        return {}

    def metrics(self) -> dict[str, Any]:
        return {}
