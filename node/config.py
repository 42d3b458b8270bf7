"""The node's configuration: one pydantic model per concern, composed into :class:`NodeConfig`.

Only pydantic here (no torch), so configs validate instantly. Each section documents its fields; the
defaults are the built-in offline demo (tiny model, easy reasoning-gym task, one CPU node).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from protocol.config import StrictModel
from protocol.transport.config import HivemindTransportConfig, ProtocolConfig, TransportConfig


class ModelConfig(StrictModel):
    """Which policy to train and where it runs."""

    name: str = "builtin:tiny"
    """Hub name, local directory, or ``builtin:tiny`` (built offline and cached on first use)."""
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """Where the policy runs; ``auto`` picks CUDA, then MPS, then CPU."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype; ``auto`` is bfloat16 on CUDA and float32 elsewhere."""
    cache_dir: Path | None = None
    """Where the built-in model is cached; default ``$XDG_CACHE_HOME/rl-swarm`` (or ``~/.cache/rl-swarm``)."""
    threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads on CPU; default: what torch picks."""


class TaskFamily(StrictModel):
    """One task family and how often to draw it."""

    name: str
    """reasoning-gym dataset name, e.g. ``chain_sum``, ``basic_arithmetic``, ``base_conversion``."""
    config: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    """Keyword arguments of the reasoning-gym generator (difficulty knobs); scalars only, they travel in TaskRefs."""
    weight: float = Field(default=1.0, gt=0)
    """Relative sampling weight among families."""


class TaskConfig(StrictModel):
    """Where prompts come from."""

    families: list[TaskFamily] = Field(
        default_factory=lambda: [
            TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
        ]
    )
    """Task families to draw from (the SAPO paper uses nine reasoning-gym families)."""
    seed: int = 0
    """Seed of the task items (shared by the swarm so peers can regenerate each other's tasks)."""
    pool_size: int = Field(default=100_000, ge=1)
    """Number of distinct items per family (indices are drawn from [0, pool_size))."""


class RolloutConfig(StrictModel):
    """How the node generates its own rollouts each step."""

    engine: Literal["transformers"] = "transformers"
    """Rollout backend; ``transformers`` runs everywhere (vLLM arrives as another type)."""
    prompts_per_step: int = Field(default=8, ge=1)
    """Task items generated per step (local groups available to the learner)."""
    group_size: int = Field(default=8, ge=2)
    """G: completions per prompt (GRPO needs at least 2)."""
    max_new_tokens: int = Field(default=32, ge=1)
    """Token budget of one completion."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature (1.0 keeps behaviour logprobs equal to the policy's)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1.0 = off; anything else makes behaviour logprobs differ from the policy's)."""
    batch_size: int = Field(default=64, ge=1)
    """Sequences per generate call (bounds memory)."""


class LearnerConfig(StrictModel):
    """The local GRPO-family learner."""

    loss: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    """Preset in ``node.losses.LOSSES``: ``grpo`` (seq-mean-token-mean, std-normalised advantages, symmetric clip),
    ``dapo`` (token-mean, clip-higher), ``dr_grpo`` (seq-mean-token-sum-norm, no std division, symmetric clip)."""
    lr: float = Field(default=3e-4, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping norm."""
    eps_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower clip range of the ratio (SAPO default 0.2)."""
    eps_high: float = Field(default=0.28, ge=0)
    """Upper clip range (clip-higher; SAPO default 0.28); the symmetric presets ``grpo``/``dr_grpo`` use eps_low."""
    beta: float = Field(default=0.0, ge=0)
    """k3 KL coefficient toward the initial policy (0 = no reference model kept)."""
    is_cap: float = Field(default=1.0, gt=0)
    """C in the truncated importance weight w = min(pi_old / pi_behaviour, C) (DART)."""
    micro_batch_size: int = Field(default=32, ge=1)
    """Sequences per forward/backward (gradient accumulation bounds memory)."""
    seed: int = 0
    """Seed of the learner's RNG (sampling, dropout)."""


class SapoConfig(StrictModel):
    """SAPO mixing of own and peers' groups (arXiv 2509.08721)."""

    local_groups: int = Field(default=8, ge=0)
    """I: own groups per training batch."""
    external_groups: int = Field(default=0, ge=0)
    """J: peers' groups per training batch (re-scored locally)."""
    external_fraction: float | None = Field(default=None, ge=0, le=1)
    """If set, overrides the split: J = round(fraction * (I + J)), I = the rest (same total batch)."""
    fill_local: bool = True
    """When peers supply fewer than J groups, train on more own groups instead (a lone node keeps its batch)."""
    max_per_peer: int | None = Field(default=None, ge=1)
    """Cap on groups from one peer per batch (default: ceil(J/2) so no single peer fills it)."""
    pool_size: int = Field(default=2048, ge=1)
    """Groups kept in the rollout pool (oldest evicted first)."""
    max_age_steps: int = Field(default=50, ge=1)
    """Groups older than this many of our steps are not sampled."""

    @model_validator(mode="after")
    def _some_groups(self) -> SapoConfig:
        if self.external_fraction is not None:
            total = self.local_groups + self.external_groups
            self.external_groups = round(self.external_fraction * total)
            self.local_groups = total - self.external_groups
            self.external_fraction = None  # resolved: the written config states I and J explicitly
        if self.local_groups + self.external_groups == 0:
            raise ValueError("local_groups + external_groups must be at least 1 (set sapo.local_groups)")
        return self


class CheckpointConfig(StrictModel):
    """How often and how many checkpoints to keep."""

    every: int = Field(default=10, ge=1)
    """Checkpoint every this many learner steps (and always at exit)."""
    keep: int = Field(default=2, ge=1)
    """Checkpoints kept on disk (older ones deleted after a new one is complete)."""


class RuntimeConfig(StrictModel):
    """How the node loop overlaps networking with compute."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    """Seconds between background fetches of peers' records (the DHT is polled; GossipSub would push)."""
    shutdown_timeout_s: float = Field(default=10.0, gt=0)
    """On stop, how long to wait for an in-flight publish before closing."""


class NodeConfig(StrictModel):
    """Everything one node needs; the YAML in ``configs/node/`` maps onto this."""

    swarm_id: str = Field(default="rl-swarm-demo", min_length=1, max_length=64)
    """Records from other swarms are rejected."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    sapo: SapoConfig = Field(default_factory=SapoConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    protocol: ProtocolConfig = Field(default_factory=ProtocolConfig)
    """Record limits and time windows (swarm-wide: peers must agree on ``window_seconds``)."""
    transport: TransportConfig = Field(default_factory=HivemindTransportConfig)
    """How records move: ``hivemind`` (default, real swarms), ``memory`` (simulator), ``libp2p``."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    seed: int = 0
    """Seed of this node's own randomness (which prompts it draws, sampling)."""

    @model_validator(mode="after")
    def _enough_prompts(self) -> NodeConfig:
        if self.sapo.local_groups > self.rollout.prompts_per_step:
            raise ValueError(
                f"sapo.local_groups ({self.sapo.local_groups}) exceeds rollout.prompts_per_step "
                f"({self.rollout.prompts_per_step}); raise prompts_per_step or lower local_groups"
            )
        return self
