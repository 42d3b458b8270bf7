"""N nodes on one event loop over one :class:`~protocol.transport.memory.MemoryNetwork`, deterministic given a seed.

The schedule is in rounds. At the start of round ``r`` the simulated clock reads
``start_time + r * round_seconds`` (validators, record stamps and network latency all read this clock, never the
wall clock), churn and partitions for round ``r`` are applied, then:

1. every *active* node (online, and ``r % speed == 0``) generates and publishes its groups;
2. every adversary publishes its hostile traffic;
3. every online node syncs (a real node polls in the background whether or not it is stepping);
4. every active node samples its SAPO batch, trains and finishes its step (metrics line).

The phases are the node's own public step pipeline (:meth:`Node.generate`, :meth:`Node.publish`,
:meth:`Node.sync`, :meth:`Node.make_batch`, :meth:`Node.learn`, :meth:`Node.finish_step`), not a copy of the loop.
Nodes share nothing mutable except the network: each has its own parts, channel, validator and RNGs, and its
identity is an Ed25519 key derived from ``(seed, index)``. Cost counters (CPU seconds per node, bytes fetched)
are kept for the scale benchmark.

Knows nothing about what the results mean (``sim.report.summary``).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from protocol.transport.base import Transport
from sim.config import SimConfig

logger = logging.getLogger(__name__)


class SimClock:
    """The simulated unix time; the simulator moves it, everything else only reads it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def derived_identity(seed: int, role: str, index: int) -> Any:
    """A deterministic Ed25519 identity: the private key is a hash of ``(seed, role, index)``."""
    from protocol.identity import Identity

    return Identity.from_private_bytes(hashlib.sha256(f"rl-swarm-sim:{seed}:{role}:{index}".encode()).digest())


class CountingTransport(Transport):
    """Delegates to ``inner`` and counts the bytes this peer publishes and fetches (the scale benchmark's cost).

    With ``fetch_cap`` a fetch returns at most that many records, a seeded random subset (``network.fetch_cap``).
    """

    def __init__(self, inner: Transport, *, fetch_cap: int | None = None, seed: int = 0) -> None:
        self.inner = inner
        self.fetch_cap = fetch_cap
        self.rng = random.Random(seed)
        self._last: tuple[float, float] = (0, 0)
        self.bytes_fetched = 0
        self.records_fetched = 0
        self.bytes_published = 0
        self.fetches = 0
        # Reach tracking (``run_seed(..., track_reach=True)``): round each record was published / first fetched.
        self.track = False
        self.round = 0
        self.published_round: dict[bytes, int] = {}
        self.seen_round: dict[bytes, int] = {}

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        self.bytes_published += len(data) + len(index or b"")
        await self.inner.publish(data, window=window, sender=sender, index=index)
        if self.track:
            self.published_round.setdefault(hashlib.sha256(data).digest(), self.round)

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        got = await self.inner.fetch_recent(windows, prefer=prefer)
        if self.fetch_cap is not None and len(got) > self.fetch_cap:
            got = self.rng.sample(got, self.fetch_cap)
        self.fetches += 1
        # Cost = what the transport read from the network this poll (new records and index entries), not the
        # records it hands back again from its cache; a transport without counters counts everything returned.
        stats = self.inner.stats()
        if "record_bytes" in stats:
            new_bytes = stats["record_bytes"] + stats["index_bytes"]
            new_records = stats["records_fetched"]
            self.bytes_fetched += int(new_bytes - self._last[0])
            self.records_fetched += int(new_records - self._last[1])
            self._last = (new_bytes, new_records)
        else:
            self.records_fetched += len(got)
            self.bytes_fetched += sum(len(d) for d in got)
        if self.track:
            for d in got:
                self.seen_round.setdefault(hashlib.sha256(d).digest(), self.round)
        return got

    async def peers(self) -> list[str]:
        return await self.inner.peers()

    def addresses(self) -> list[str]:
        return self.inner.addresses()

    async def close(self) -> None:
        await self.inner.close()

    def set_record_validator(self, validate: Any) -> None:
        self.inner.set_record_validator(validate)

    def rejections(self) -> dict[str, int]:
        return self.inner.rejections()

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    @property
    def record_validator(self) -> Any:
        return self.inner.record_validator


@dataclass
class NodeCost:
    """What one honest node spent over the run."""

    steps: int = 0
    cpu_s: float = 0.0
    bytes_fetched: int = 0
    records_fetched: int = 0
    bytes_published: int = 0


@dataclass
class SeedResult:
    """Outcome of one (configuration, seed) run."""

    variant: str
    seed: int
    run_dir: Path
    wall_s: float = 0.0
    costs: list[NodeCost] = field(default_factory=list)
    rounds: list[dict[str, float]] = field(default_factory=list)
    """Per round, swarm totals so far: ``cpu_s``, ``bytes_fetched``, ``records_fetched``; and that round's ``steps``."""
    final: list[dict[str, Any]] = field(default_factory=list)
    external_sources: list[dict[str, int]] = field(default_factory=list)
    """Per honest node: external groups it trained on from the first adversary's ``start`` round on, by sender."""
    honest: list[str] = field(default_factory=list)
    """Peer ids of the honest nodes (index order)."""
    reach: dict[int, float] = field(default_factory=dict)
    """With ``track_reach``: k -> share of (record published in round ``reach_round``, other online node) pairs where
    the node fetched the record within k rounds (k = 1 is the round it was published in)."""


def protocol_config(cfg: NodeConfig) -> Any:
    """The node's protocol limits (``protocol:`` section), or the defaults if the node config has none."""
    from protocol.transport.config import ProtocolConfig

    return getattr(cfg, "protocol", None) or ProtocolConfig()


def build_node_parts(sim: SimConfig, cfg: NodeConfig) -> Any:
    """The node's heavy parts: the real ones (``node.runtime.build_parts``) or the scripted stand-ins."""
    if sim.policy == "scripted":
        from sim.scripted import build_scripted_parts

        s = sim.scripted
        return build_scripted_parts(
            cfg, lr=s.lr, init_p=s.init_p, init_spread=s.init_spread, max_p=s.max_p, answer_tokens=s.answer_tokens
        )
    from node.runtime import build_parts

    return build_parts(cfg)


async def _open_channel(identity: Any, transport: Transport, swarm_id: str, pcfg: Any, clock: SimClock) -> Any:
    from protocol.channel import Channel
    from protocol.validation import RecordValidator

    validator = RecordValidator.from_config(swarm_id, pcfg, clock=clock)
    return await Channel.create(
        identity,
        transport,
        validator,
        fetch_past_windows=pcfg.fetch_past_windows,
        timeout_s=pcfg.timeout_s,
        work_bits=pcfg.index_work_bits,
    )


async def run_seed(
    sim: SimConfig,
    variant: str,
    seed: int,
    out: str | Path,
    on_step: Callable[[int], None] | None = None,
    *,
    track_reach: bool = False,
    reach_round: int = 2,
) -> SeedResult:
    """Run configuration ``variant`` of ``sim`` with ``seed``; metrics go to ``out/<variant>/seed<seed>/node<i>/``.

    ``on_step(k)`` is called after each round with the number of rounds done (progress display).
    ``track_reach`` records which round each node first fetched each record (the scale benchmark's reach table,
    for the records published in round ``reach_round``)."""
    from node.runtime import Node, StepTimes
    from protocol.transport.memory import MemoryNetwork, MemoryTransport
    from sim.adversary import Adversary, wrap_transport

    if sim.policy == "real":
        import torch

        torch.set_num_threads(sim.torch_threads)
        torch.manual_seed(seed)
    run_dir = Path(out) / variant / f"seed{seed}"
    result = SeedResult(variant, seed, run_dir)
    t_start = time.perf_counter()
    clock = SimClock(sim.start_time)
    cfgs = [sim.node_config(variant, i, seed) for i in range(sim.nodes)]
    for c in cfgs:
        c.checkpoint.every = 10**9  # the simulator keeps state in memory; no checkpoint files per step
    pcfg = protocol_config(cfgs[0])
    net = sim.network
    network = MemoryNetwork(
        seed=seed,
        clock=clock,
        latency_s=net.latency_steps * sim.round_seconds,
        loss=net.loss,
        duplicate=net.duplication,
        retention_windows=max(8, pcfg.max_past_windows + 2),
    )

    nodes: list[Any] = []
    transports: list[CountingTransport] = []
    adversaries: list[Adversary] = []
    try:
        for i, cfg in enumerate(cfgs):
            ident = derived_identity(seed, "node", i)
            transport = CountingTransport(
                MemoryTransport(network, ident.peer_id, protocol=pcfg, swarm=cfg.swarm_id, seed=seed * 100_003 + i),
                fetch_cap=net.fetch_cap,
                seed=seed * 100_003 + i,
            )
            channel = await _open_channel(ident, transport, cfg.swarm_id, pcfg, clock)
            parts = build_node_parts(sim, cfg)
            node = await Node.create(
                cfg,
                run_dir / f"node{i}",
                channel=channel,
                parts=parts,
                name=ident.peer_id,
                resume=False,
                live=False,
                durable=False,  # a simulation is reproduced from its seed, not recovered from disk
                # Thousands of nodes x two open files exceed the usual open-file limit; the per-step metrics
                # (what the scale benchmark reads) stay, the rollout samples go.
                keep_rollouts=sim.nodes <= 2000,
            )
            nodes.append(node)
            transport.track = track_reach
            transports.append(transport)
        result.costs = [NodeCost() for _ in nodes]
        result.external_sources = [{} for _ in nodes]
        result.honest = [n.name for n in nodes]
        base = cfgs[0]
        families = [(f.name, dict(f.config)) for f in base.tasks.families]

        def adversary_refs(rng: Any, base: NodeConfig = base) -> list[Any]:
            from protocol.types import TaskRef

            picks = [families[rng.randrange(len(families))] for _ in range(2)]
            return [TaskRef(family=n, config=c, seed=base.tasks.seed, index=rng.randrange(1000)) for n, c in picks]

        k = 0
        for adv in sim.adversaries:
            if adv.type == "sybil":
                adversaries.append(_sybils(sim, adv, network, pcfg, clock, adversary_refs, seed, base))
                continue
            for _ in range(adv.count):
                ident = derived_identity(seed, f"adversary-{adv.type}", k)
                inner = MemoryTransport(network, ident.peer_id, protocol=pcfg, seed=seed * 1000 + k)
                swarm_id = base.swarm_id if adv.type != "wrong_swarm" else f"not-{base.swarm_id}"[:64]
                hostile_transport = wrap_transport(
                    adv.type,
                    inner,
                    identity=ident,
                    swarm_id=swarm_id,
                    records_per_round=adv.records_per_round,
                    clock=clock,
                    window_seconds=pcfg.window_seconds,
                    seed=seed * 1000 + k,
                )
                channel = await _open_channel(ident, hostile_transport, swarm_id, pcfg, clock)
                if hasattr(hostile_transport, "list_as"):  # what the attack injects is listed in its own entry
                    hostile_transport.list_as(channel.index_writer)
                adversaries.append(
                    Adversary(adv.type, channel, adversary_refs, base.rollout.group_size, seed * 1000 + k)
                )
                k += 1

        # Held-out evaluation as a real node does it (start, every ``eval.every_steps``, end); a scripted policy
        # has no model to evaluate.
        evaluating = sim.policy == "real"
        if evaluating:
            for node in nodes:
                node.evaluate_start()
        online = [True] * len(nodes)
        attack_start = min((adv.start for adv in sim.adversaries), default=0)
        for r in range(sim.steps):
            clock.now = sim.start_time + r * sim.round_seconds
            for t in transports:
                t.round = r
            _apply_churn(sim, r, nodes, online, network)
            _apply_partitions(sim, r, nodes, network)
            active = [i for i in range(len(nodes)) if online[i] and r % sim.speed(i) == 0]
            own: dict[int, Any] = {}
            t_gen: dict[int, float] = {}
            for i in active:
                c0, w0 = time.process_time(), time.perf_counter()
                own[i] = nodes[i].generate()
                await nodes[i].publish(own[i])
                t_gen[i] = time.perf_counter() - w0
                result.costs[i].cpu_s += time.process_time() - c0
            for hostile in adversaries:
                await hostile.act()
            for i in range(len(nodes)):
                if online[i]:
                    c0 = time.process_time()
                    await nodes[i].sync()
                    result.costs[i].cpu_s += time.process_time() - c0
            for i in active:
                node = nodes[i]
                c0, w0 = time.process_time(), time.perf_counter()
                batch = node.make_batch(own[i])
                if r >= attack_start:
                    by_source = result.external_sources[i]
                    for g in batch.sapo.external:
                        by_source[g.source] = by_source.get(g.source, 0) + 1
                t1 = time.perf_counter()
                train_metrics = node.learn(batch)
                t_train = time.perf_counter() - t1
                t_step = t_gen[i] + time.perf_counter() - w0
                if evaluating and node.eval_due():
                    c1 = time.process_time()
                    node.evaluate(node.step + 1)
                    c0 += time.process_time() - c1  # evaluation is not part of a node's step cost
                node.finish_step(own[i], batch, train_metrics, StepTimes(t_gen[i], t_train, t_step))
                result.costs[i].cpu_s += time.process_time() - c0
                result.costs[i].steps += 1
            result.rounds.append(
                {
                    "round": r,
                    "steps": len(active),
                    "cpu_s": sum(c.cpu_s for c in result.costs),
                    "bytes_fetched": sum(t.bytes_fetched for t in transports),
                    "records_fetched": sum(t.records_fetched for t in transports),
                }
            )
            if on_step is not None:
                on_step(r + 1)
        if evaluating:
            for node in nodes:
                node.evaluate_end()
        for i, t in enumerate(transports):
            cost = result.costs[i]
            cost.bytes_fetched, cost.records_fetched, cost.bytes_published = (
                t.bytes_fetched,
                t.records_fetched,
                t.bytes_published,
            )
        result.final = [dict(n.last_metrics) for n in nodes]
        if track_reach:
            result.reach = _reach(transports, reach_round, sim.steps - reach_round)
    finally:
        for node in nodes:
            await node.close()
        for hostile in adversaries:
            await hostile.close()
    result.wall_s = time.perf_counter() - t_start
    logger.debug("%s seed %d: %d nodes x %d rounds in %.1fs", variant, seed, len(nodes), sim.steps, result.wall_s)
    return result


def _sybils(sim: SimConfig, adv: Any, network: Any, pcfg: Any, clock: SimClock, refs: Any, seed: int, base: Any):
    """The ``sybil`` adversary: one publisher transport, ``adv.count`` fresh identities per round."""
    from protocol.transport.memory import MemoryTransport
    from sim.adversary import SybilSwarm

    if sim.policy != "scripted":
        raise ValueError("the sybil adversary needs the scripted policy (it answers scripted tasks correctly)")
    from sim.scripted import gold_answer, question_of

    return SybilSwarm(
        MemoryTransport(network, f"sybils-{seed}", protocol=pcfg),
        count=adv.count,
        swarm_id=base.swarm_id,
        refs=refs,
        solve=lambda ref: gold_answer(question_of(ref)),
        group_size=base.rollout.group_size,
        clock=clock,
        window_seconds=pcfg.window_seconds,
        seed=seed,
        start=adv.start,
    )


def _reach(transports: list[CountingTransport], r0: int, k_max: int) -> dict[int, float]:
    published = {d: i for i, t in enumerate(transports) for d, r in t.published_round.items() if r == r0}
    if not published or len(transports) < 2:
        return {}
    pairs = len(published) * (len(transports) - 1)
    delays: list[int] = []  # rounds after r0 at which some other node first fetched one of r0's records
    for j, t in enumerate(transports):
        for d, r in t.seen_round.items():
            if published.get(d, j) != j:
                delays.append(r - r0)
    return {k: sum(1 for x in delays if x < k) / pairs for k in range(1, k_max + 1)}


def _apply_churn(sim: SimConfig, r: int, nodes: list[Any], online: list[bool], network: Any) -> None:
    for ev in sim.churn:
        peer = nodes[ev.node].name
        if r == ev.leave and online[ev.node]:
            online[ev.node] = False
            network.leave(peer)
            logger.info("round %d: node %d leaves", r, ev.node)
        elif ev.rejoin is not None and r == ev.rejoin and not online[ev.node]:
            online[ev.node] = True
            network.join(peer)
            logger.info("round %d: node %d rejoins", r, ev.node)


def _apply_partitions(sim: SimConfig, r: int, nodes: list[Any], network: Any) -> None:
    for p in sim.network.partitions:
        if p.start <= r < p.end:
            network.partition(*[[nodes[i].name for i in g] for g in p.groups])
            return
    network.heal()
