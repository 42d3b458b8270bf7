"""The experiment config of ``swarm-sim``: how many nodes, which variants, which faults, which policy.

An experiment runs every named *configuration* (a variant of the node config, e.g. SAPO's I/J split) for every
seed, on the same swarm: ``nodes`` nodes stepping for ``steps`` rounds. The per-node :class:`NodeConfig` is built
by deep-merging, in order: ``node`` (the base), the configuration's ``node`` overrides, the node's entry in
``heterogeneity.node_overrides``, the configuration's ``node_overrides``, and the node's seed. Every merged config
is validated up front, so a bad node field is one :class:`ConfigError` line before anything runs.

Only pydantic here (no torch): configs validate instantly. Knows nothing about how nodes are run.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from node.config import NodeConfig
from protocol.config import StrictModel, validate_config
from protocol.errors import ConfigError
from sim.registration import Registration

#: Kinds of adversarial node (see ``sim.adversary``).
AdversaryType = Literal["garbage", "forged_reward", "replay", "flood", "wrong_swarm", "tamper", "sybil"]


Method = Literal["ht_mnpo", "td_mnpo", "ipo", "dpo"]
METHODS: tuple[Method, ...] = get_args(Method)


class MnpoGameConfig(StrictModel):
    """Part (b) of the MNPO experiment: a population of categorical policies with a non-transitive oracle."""

    players: int = Field(default=6, ge=2, le=64)
    """Players per method (the population, 4-8 in B6)."""
    responses: int = Field(default=5, ge=3, le=101)
    """Size of the fixed response set (odd: the cyclic tournament needs it)."""
    cyclic: float = Field(default=0.8, ge=0, le=1)
    """Strength of the rock-paper-scissors-like cyclic preference."""
    transitive: float = Field(default=0.3, ge=0, le=1)
    """Strength of a transitive ranking on top (lower response index better)."""
    heterogeneity: float = Field(default=0.4, ge=0, le=2)
    """Per-player disagreement with the population preference (centred skew-symmetric noise)."""
    steps: int = Field(default=300, ge=1, le=1_000_000)
    """Learner steps per player."""
    samples_per_step: int = Field(default=3, ge=1, le=1000)
    """Responses each player samples into the shared pool per step."""
    pairs_per_step: int = Field(default=8, ge=1, le=10_000)
    """Preference pairs per update (the same for every method)."""
    lr: float = Field(default=0.05, gt=0, le=100)
    """Adam learning rate on the logits."""
    eta: float = Field(default=0.5, gt=0, le=100)
    """MNPO / IPO eta (target margin 1/(2 eta) on log-ratios)."""
    ratio: float = Field(default=0.3, ge=0, le=1)
    """MNPO weight of the reference in the mixture the player competes against."""
    dpo_beta: float = Field(default=1.0, gt=0, le=100)
    """beta of the DPO baseline."""
    max_opponents: int = Field(default=4, ge=1, le=64)
    """Opponents per pair."""
    history: int = Field(default=4, ge=1, le=64)
    """Own past versions kept (TD-MNPO, and the HT fallback)."""
    init_spread: float = Field(default=1.5, ge=0, le=20)
    """Std of the initial logits (players start at different policies; each one's start is its reference)."""
    eval_every: int = Field(default=10, ge=1)
    """Steps between metric evaluations."""
    methods: list[Method] = Field(default_factory=lambda: list(METHODS), min_length=1)
    """Methods compared (same budget); ``ipo``/``dpo`` play against the reference only (n = 2)."""

    @model_validator(mode="after")
    def _check(self) -> MnpoGameConfig:
        if self.responses % 2 == 0:
            raise ValueError(f"mnpo_game.responses must be odd (cyclic tournament), got {self.responses}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError("mnpo_game.methods must be distinct")
        return self


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A new mapping: ``override`` merged into ``base`` recursively (mappings merge, anything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def node_seed(seed: int, index: int) -> int:
    """The seed of node ``index`` in run ``seed``: distinct per node, stable across processes (31 bits)."""
    digest = hashlib.sha256(f"sim-node:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


class Variant(StrictModel):
    """One named configuration of the experiment (a row of the results table)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.+-]+$")
    """Row label and output directory name (letters, digits, ``_ . + -``; e.g. ``8-0``, ``4-4``)."""
    description: str = ""
    """Free text shown in the results table."""
    node: dict[str, Any] = Field(default_factory=dict)
    """Node config overrides for this variant, deep-merged over the experiment's base ``node`` mapping."""
    node_overrides: dict[int, dict[str, Any]] = Field(default_factory=dict)
    """Node index -> overrides for that node in this variant only (e.g. a heterogeneous population's models),
    merged after ``heterogeneity.node_overrides``."""


class Partition(StrictModel):
    """A network partition: during rounds ``[start, end)`` only nodes in the same group hear each other."""

    start: int = Field(ge=0)
    """First round of the partition."""
    end: int = Field(ge=1)
    """Round at which the network heals (exclusive)."""
    groups: list[list[int]] = Field(min_length=2)
    """Disjoint lists of node indices; nodes in no group (and adversaries) form one more group."""

    @model_validator(mode="after")
    def _check(self) -> Partition:
        if self.end <= self.start:
            raise ValueError(f"partition end ({self.end}) must be after start ({self.start})")
        seen: set[int] = set()
        for g in self.groups:
            if seen & set(g):
                raise ValueError(f"partition groups overlap on nodes {sorted(seen & set(g))}; make them disjoint")
            seen |= set(g)
        return self


class NetworkConfig(StrictModel):
    """Faults of the simulated network (in-process mode only; applied to honest traffic too)."""

    latency_steps: int = Field(default=0, ge=0, le=1000)
    """Rounds between a publish and the record becoming visible to others (0 = same round)."""
    loss: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Probability that a record is not delivered to a given receiver."""
    duplication: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that a delivered record is delivered a second time (receivers must dedupe)."""
    partitions: list[Partition] = Field(default_factory=list)
    """Time-limited partitions of the swarm."""
    fetch_cap: int | None = Field(default=None, ge=1, le=1_000_000)
    """Most records one poll of a node returns, a seeded random subset of what the transport returned (an extra
    cap on top of the transport's own bounded read, ``protocol.poll_records``); ``None`` = no extra cap."""


class Heterogeneity(StrictModel):
    """Nodes that differ: slower hardware, other models or settings."""

    speed: dict[int, int] = Field(default_factory=dict)
    """Node index -> speed factor k >= 1: that node steps once every k rounds (default 1, every round)."""
    node_overrides: dict[int, dict[str, Any]] = Field(default_factory=dict)
    """Node index -> node config overrides (e.g. ``{model: {name: ...}}``), merged last."""

    @model_validator(mode="after")
    def _check(self) -> Heterogeneity:
        bad = {i: k for i, k in self.speed.items() if k < 1 or k > 1000}
        if bad:
            raise ValueError(f"speed factors must be in [1, 1000], got {bad}")
        return self


class ChurnEvent(StrictModel):
    """Node ``node`` leaves the swarm at round ``leave`` and comes back at round ``rejoin`` (if set)."""

    node: int = Field(ge=0)
    """Index of the node that leaves."""
    leave: int = Field(ge=0)
    """First round it is gone (it neither steps, publishes nor receives)."""
    rejoin: int | None = Field(default=None, ge=1)
    """Round it comes back with its state (a new connection, same identity); ``None`` = never."""

    @model_validator(mode="after")
    def _check(self) -> ChurnEvent:
        if self.rejoin is not None and self.rejoin <= self.leave:
            raise ValueError(f"churn of node {self.node}: rejoin ({self.rejoin}) must be after leave ({self.leave})")
        return self


class AdversaryConfig(StrictModel):
    """A group of adversarial nodes that join the swarm and publish hostile records every round."""

    type: AdversaryType
    """``garbage`` (random bytes), ``forged_reward`` (signed records with wrong answers and reward hint 1),
    ``replay`` (honest records re-sent), ``flood`` (signed junk beyond the per-peer quota), ``wrong_swarm``
    (signed records for another swarm id), ``tamper`` (honest records with flipped bytes), ``sybil`` (``count``
    throwaway identities per round, each publishing one valid record of informative groups: right and wrong
    answers, so re-scoring keeps them; scripted policy only)."""
    count: int = Field(default=1, ge=0, le=10_000)
    """How many such nodes."""
    start: int = Field(default=0, ge=0)
    """``sybil`` only: round from which it acts (a flood that arrives in an established swarm); the simulator
    counts honest nodes' external groups by sender from the earliest ``start`` on."""
    records_per_round: int = Field(default=2, ge=1, le=10_000)
    """Records each publishes per round (``flood`` should exceed the validators' quota)."""


class ScriptedConfig(StrictModel):
    """The cheap scripted policy (``sim.scripted``): a per-family success probability that learning raises."""

    lr: float = Field(default=2.0, gt=0, le=100)
    """Step size of the policy-gradient update on each family's logit (the signal is normalised by the nominal
    batch G * (I + J))."""
    init_p: float = Field(default=0.03, gt=0, lt=1)
    """Mean initial success probability per family."""
    init_spread: float = Field(default=2.0, ge=0, le=10)
    """Std of the per-node, per-family initial logit around logit(init_p): nodes start good at different things."""
    max_p: float = Field(default=0.98, gt=0, le=1)
    """Success probabilities are capped here (a policy is never perfect)."""
    answer_tokens: int = Field(default=12, ge=1, le=1024)
    """Padding length of a scripted completion (bytes on the wire scale with it)."""


class MultiprocessConfig(StrictModel):
    """How real ``swarm-node join`` processes are started (multiprocess mode)."""

    startup_timeout_s: float = Field(default=180.0, gt=0, le=3600)
    """How long to wait for the first node to print its listening address."""
    run_timeout_s: float = Field(default=1800.0, gt=0, le=86_400)
    """How long all nodes may take to finish ``steps`` steps before they are terminated."""
    stagger_s: float = Field(default=0.5, ge=0, le=60)
    """Pause between starting two nodes (they load a model each)."""
    linger_s: float = Field(default=0.0, ge=0, le=3600)
    """How long the bootstrap node (node 0) stays in the swarm after its last step (``swarm-node join --linger``), so
    nodes still starting can join through it: a fast model can finish a short run before a slow peer is up."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments for every ``swarm-node join``."""


class SimConfig(StrictModel):
    """A simulator experiment; the YAML in ``configs/sim/`` maps onto this."""

    name: str = Field(default="experiment", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.+-]+$")
    """Experiment name (titles of tables and plots)."""
    mode: Literal["inprocess", "multiprocess"] = "inprocess"
    """``inprocess``: all nodes on one event loop over the memory transport (deterministic, faults);
    ``multiprocess``: real ``swarm-node join`` processes over hivemind on 127.0.0.1."""
    policy: Literal["real", "scripted"] = "real"
    """``real``: the node's actual parts (the configured model, reasoning-gym tasks); ``scripted``: a cheap
    stand-in for scale tests (``sim.scripted``)."""
    nodes: int = Field(default=4, ge=1, le=10_000)
    """Honest nodes in the swarm."""
    steps: int = Field(default=10, ge=1, le=1_000_000)
    """Rounds to simulate (a node with speed factor 1 takes one learner step per round)."""
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=100)
    """One run per seed per configuration; results are averaged over seeds."""
    node: dict[str, Any] = Field(default_factory=dict)
    """Base node config (``NodeConfig`` fields) applied to every node. In-process mode ignores ``transport``
    (nodes share one memory network) but uses ``protocol`` (windows, quotas) for every node's validator."""
    configurations: list[Variant] = Field(default_factory=lambda: [Variant(name="default")], min_length=1)
    """Named variants; the first is the baseline the results table compares against."""
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    """Latency, loss, duplication, partitions of the simulated network (in-process mode)."""
    heterogeneity: Heterogeneity = Field(default_factory=Heterogeneity)
    """Per-node speed factors and config overrides (e.g. another model)."""
    churn: list[ChurnEvent] = Field(default_factory=list)
    """Nodes leaving and rejoining."""
    adversaries: list[AdversaryConfig] = Field(default_factory=list)
    """Hostile nodes (in-process mode); they never train and are not part of the results."""
    scripted: ScriptedConfig = Field(default_factory=ScriptedConfig)
    """Parameters of the scripted policy (used when ``policy: scripted``)."""
    multiprocess: MultiprocessConfig = Field(default_factory=MultiprocessConfig)
    """Process start-up and time limits (used when ``mode: multiprocess``)."""
    round_seconds: float = Field(default=10.0, gt=0, le=86_400)
    """Simulated seconds per round (the clock the validators and record stamps see)."""
    start_time: float = Field(default=1_700_000_000.0, ge=0)
    """Simulated unix time of round 0 (fixed, so runs are reproducible)."""
    torch_threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of the simulator process (in-process nodes share them)."""
    workers: int = Field(default=1, ge=1, le=64)
    """In-process mode: run this many (configuration, seed) pairs at once, each in its own process with
    ``torch_threads`` threads. A pair's records do not depend on it (every pair seeds its own generators), so on
    a machine with spare cores it divides an experiment's wall time without changing a number."""
    mnpo_game: MnpoGameConfig | None = None
    """The MNPO experiment (B6): after the configurations ran, the non-transitive population game and the report
    ``mnpo.md`` (``sim.experiments.mnpo_game``); None for other experiments."""
    quick: dict[str, Any] = Field(default_factory=dict)
    """Overrides applied by ``--quick`` (dotted keys, e.g. ``steps: 3``, ``seeds: [0]``)."""
    registration: Registration | None = None
    """A learning experiment's pre-registration (``sim.registration``), run by ``swarm-sim experiment``; ignored
    by ``swarm-sim run``."""

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        names = [v.name for v in self.configurations]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"configuration names must be unique; rename {sorted(dup)}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        n = self.nodes

        def check_index(where: str, i: int) -> None:
            if not 0 <= i < n:
                raise ValueError(f"{where} names node {i}, but nodes are 0..{n - 1}; fix the index or raise nodes")

        for i in self.heterogeneity.speed:
            check_index("heterogeneity.speed", i)
        for i in self.heterogeneity.node_overrides:
            check_index("heterogeneity.node_overrides", i)
        for v in self.configurations:
            for i in v.node_overrides:
                check_index(f"configuration {v.name!r} node_overrides", i)
        for ev in self.churn:
            check_index("churn", ev.node)
        for p in self.network.partitions:
            for g in p.groups:
                for i in g:
                    check_index("network.partitions", i)
        if self.mode == "multiprocess":
            unsupported = []
            if self.policy != "real":
                unsupported.append("policy: scripted")
            if self.adversaries:
                unsupported.append("adversaries")
            if self.network != NetworkConfig():
                unsupported.append("network faults")
            if self.churn:
                unsupported.append("churn")
            if self.heterogeneity.speed:
                unsupported.append("heterogeneity.speed")
            if unsupported:
                raise ValueError(
                    f"mode multiprocess does not support {', '.join(unsupported)}; use mode: inprocess or remove them"
                )
        for v in self.configurations:  # every node of every variant must be a valid NodeConfig
            for i in sorted({0, *self.heterogeneity.node_overrides, *v.node_overrides}):
                try:
                    self.node_config(v.name, i, self.seeds[0])
                except ConfigError as e:
                    raise ValueError(f"configuration {v.name!r}, node {i}: {e}") from None
        if self.registration is not None:
            self._check_registration(self.registration)
        if self.policy == "scripted":
            from sim.scripted import MIN_NEW_TOKENS

            for v in self.configurations:
                if self.node_config(v.name, 0, self.seeds[0]).rollout.max_new_tokens < MIN_NEW_TOKENS:
                    raise ValueError(f"policy scripted needs node.rollout.max_new_tokens >= {MIN_NEW_TOKENS}")
        return self

    def _check_registration(self, reg: Registration) -> None:
        """The registration's arms, nodes and readout exist in this experiment, and its side is the nodes'."""
        missing = [a for a in reg.arms if a not in {v.name for v in self.configurations}]
        if missing:
            raise ValueError(f"registration arms {missing} are not configurations of the experiment; add or rename")
        nodes = [*(reg.measured or []), *(i for part in reg.parts.values() for i in part)]
        for i in nodes:
            if not 0 <= i < self.nodes:
                raise ValueError(f"registration names node {i}, but nodes are 0..{self.nodes - 1}")
        if isinstance(reg.readout, int) and reg.readout > self.steps:
            raise ValueError(f"registration readout {reg.readout} is after the last step ({self.steps})")
        ev = self.node_config(self.configurations[0].name, 0, self.seeds[0]).eval
        if ev.side != reg.side:
            raise ValueError(f"registration side {reg.side!r} differs from the nodes' eval.side {ev.side!r}")
        if reg.per_seed and not ev.at_start:
            raise ValueError("registration per_seed draws each seed's warm start: set node.eval.at_start: true")

    def variant(self, name: str) -> Variant:
        for v in self.configurations:
            if v.name == name:
                return v
        raise KeyError(name)

    def node_mapping(self, variant: str, index: int, seed: int) -> dict[str, Any]:
        """The merged (unvalidated) node mapping of node ``index`` in configuration ``variant``, run ``seed``."""
        data = deep_merge(self.node, self.variant(variant).node)
        data = deep_merge(data, self.heterogeneity.node_overrides.get(index, {}))
        data = deep_merge(data, self.variant(variant).node_overrides.get(index, {}))
        data["seed"] = node_seed(seed, index)
        return data

    def node_config(self, variant: str, index: int, seed: int) -> NodeConfig:
        """The validated :class:`NodeConfig` of node ``index`` in configuration ``variant``, run ``seed``."""
        return validate_config(NodeConfig, self.node_mapping(variant, index, seed), f"node {index} of {variant!r}")

    def speed(self, index: int) -> int:
        return self.heterogeneity.speed.get(index, 1)

    def trackers(self) -> list[str]:
        """The trackers any node asks for (``report_to``); nodes open none unless their config names one."""
        names: dict[str, None] = {}
        for v in self.configurations:
            for i in sorted({0, *self.heterogeneity.node_overrides, *v.node_overrides}):
                names.update(dict.fromkeys(self.node_config(v.name, i, self.seeds[0]).report_to))
        return list(names)


def apply_quick(data: dict[str, Any]) -> dict[str, Any]:
    """The raw experiment mapping with its ``quick:`` overrides applied (dotted keys allowed)."""
    quick = data.get("quick") or {}
    if not isinstance(quick, dict):
        raise ConfigError("quick: must be a mapping of overrides")
    out = copy.deepcopy(data)
    for key, value in quick.items():
        node = out
        parts = str(key).split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"quick override {key!r}: {part!r} is not a section")
        node[parts[-1]] = copy.deepcopy(value)
    return out


def load_sim_config(path: str | None, overrides: list[str] | tuple[str, ...] = (), *, quick: bool = False) -> SimConfig:
    """YAML file -> ``--quick`` overrides -> ``key=value`` overrides -> validated :class:`SimConfig`."""
    from protocol.config import _set_path, parse_override, read_yaml

    data = read_yaml(path) if path is not None else {}
    if quick:
        data = apply_quick(data)
    for text in overrides:
        key, value = parse_override(text)
        _set_path(data, key, value)
    return validate_config(SimConfig, data, str(path) if path is not None else "(defaults + overrides)")
