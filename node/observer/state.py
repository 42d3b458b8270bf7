"""The swarm observer's state: validate raw record bytes, re-score every completion, aggregate what a page shows.

:class:`SwarmObserver` receives the raw bytes of records (from the reader child process of ``node.observer.watch``) and
puts each one through the same :class:`~protocol.validation.RecordValidator` a node uses (size cap, decode,
signature, swarm, window, replay, quota; rejections counted by reason). For every accepted ``rollouts`` record
it regenerates each group's question and gold answer from its :class:`~protocol.types.TaskRef` and re-scores
every completion with the node's own verifier (:class:`node.tasks.TaskSource`), so the numbers it shows are
*verified*; the sender's ``reward_hint`` is kept beside them only to flag a gap.

Unlike a node, the observer accepts refs of any family and config it sees (it does not train), so
:class:`BoundedTasks` bounds what it regenerates: at most ``max_configs`` task configs live at a time (LRU), at
most ``new_configs_per_minute`` new ones built, at most ``max_groups_per_record`` groups scored per record;
refs it cannot or will not materialize are counted as refusals by reason and never crash it.

:meth:`SwarmObserver.state` returns one JSON-able snapshot (the ``/api/state`` document). Thread-safe: feeding
runs off the event loop, reading from it. Torch-free and network-free: it knows nothing about transports,
HTTP or how the bytes arrived.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.types import Envelope, Group, RolloutBatch, TaskRef
from protocol.validation import RecordValidator

logger = logging.getLogger(__name__)

#: Characters of a completion kept for the page's "recent completions" list.
TEXT_PREVIEW_CHARS = 400
#: A peer's self-reported reward is flagged when it differs from the verified one by more than this much
#: (and by more than 3 standard errors of the verified mean), once enough completions were seen.
GAP_MIN = 0.1
GAP_MIN_COMPLETIONS = 8


@dataclass
class ObserverLimits:
    """Bounds on everything the observer keeps or computes (a hostile peer cannot grow any of them)."""

    max_configs: int = 16
    """Distinct task configs (family, config, seed) materialized at a time; least recently used evicted."""
    new_configs_per_minute: int = 8
    """New task configs built per minute; more are refused (``task_budget``) so nobody makes us build datasets."""
    max_groups_per_record: int = 64
    """Groups re-scored per record; the rest are counted (``groups_unscored``) and not shown."""
    max_peers: int = 1024
    """Peers tracked; the least recently seen is forgotten beyond this."""
    series_points: int = 600
    """Points kept per time series (per peer, per family, swarm-wide)."""
    bucket_s: float = 5.0
    """Width of one time-series bucket in seconds."""
    recent_per_peer: int = 4
    """Completions kept per peer for the page's recent list (each peer's latest, so none is crowded out)."""
    recent_peers: int = 32
    """Peers (most recently seen) whose recent completions the state lists."""
    active_s: float = 60.0
    """A peer counts as active for this long after its last record."""


class BoundedTasks:
    """Regenerate and score refs of any family/config, within :class:`ObserverLimits`; refusals by reason.

    Each distinct (family, config, seed) gets its own :class:`node.tasks.TaskSource` (the exact code a node
    scores with), kept in an LRU; configs that failed to build are remembered (also bounded) so a hostile ref
    is not retried.
    """

    def __init__(self, limits: ObserverLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.clock = clock
        self._sources: OrderedDict[tuple[str, str, int], Any] = OrderedDict()
        self._failed: OrderedDict[tuple[str, str, int], str] = OrderedDict()
        self._built: deque[float] = deque()
        self.refused: dict[str, int] = {}
        self.built = 0

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def _source(self, ref: TaskRef) -> Any | None:
        from node.config import TaskConfig, TaskFamily
        from node.tasks import TaskError, TaskSource, resolve_family, split_wire_family

        key = (ref.family, json.dumps(dict(ref.config), sort_keys=True, separators=(",", ":")), ref.seed)
        if key in self._sources:
            self._sources.move_to_end(key)
            return self._sources[key]
        if key in self._failed:
            self._refuse(self._failed[key])
            return None
        now = self.clock()
        while self._built and self._built[0] < now - 60.0:
            self._built.popleft()
        if len(self._built) >= self.limits.new_configs_per_minute:
            self._refuse("task_budget")
            return None
        self._built.append(now)
        reason = ""
        try:
            name, version = split_wire_family(ref.family)
            try:
                family = resolve_family(name)
            except TaskError:
                family = None
            if family is None:
                reason = "unknown_family"
            elif family.version != version:
                reason = "task_version"
            elif not isinstance(ref.seed, int) or ref.seed < 0 or "seed" in ref.config:
                reason = "bad_task_seed"
            else:
                cfg = TaskConfig(families=[TaskFamily(name=name, config=dict(ref.config))], seed=ref.seed)
                source = TaskSource(cfg, cache_items=1024)
        except TaskError:
            reason = "bad_task_config"
        except Exception as e:  # a generator crashing on a hostile config is a refusal, not an observer failure
            logger.debug("building task source for %s failed: %r", ref.family, e)
            reason = "bad_task_config"
        if reason:
            self._failed[key] = reason
            while len(self._failed) > 4 * self.limits.max_configs:
                self._failed.popitem(last=False)
            self._refuse(reason)
            return None
        self.built += 1
        self._sources[key] = source
        while len(self._sources) > self.limits.max_configs:
            self._sources.popitem(last=False)
        return source

    def score(self, ref: TaskRef, texts: list[str]) -> tuple[list[float], list[bool]] | None:
        """Verified rewards of ``texts`` for ``ref`` (as a node scores them: partial credit) and whether each answer
        is exactly right, or None (counted) if refused."""
        from node.tasks import extract_answer, is_exact

        source = self._source(ref)
        if source is None:
            return None
        try:
            item = source.materialize(ref)
        except Exception as e:
            logger.debug("materialize %s failed: %r", ref.key()[:80], e)
            reason = getattr(e, "reason", "task_rejected")
            self._refuse("bad_task_index" if reason == "task_rejected" else reason)
            return None
        try:
            rewards = [float(source.score(item, t)) for t in texts]
        except Exception as e:  # a plug-in failing on a peer's completion is a refusal, not an observer failure
            logger.debug("scoring %s failed: %r", ref.key()[:80], e)
            self._refuse(getattr(e, "reason", "score_error"))
            return None
        return rewards, [is_exact(item, extract_answer(t), r) for t, r in zip(texts, rewards, strict=True)]


@dataclass
class _Stat:
    """Sum and count of rewards (verified, or self-reported)."""

    total: float = 0.0
    n: int = 0

    def add(self, values: list[float]) -> None:
        self.total += math.fsum(values)
        self.n += len(values)

    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class _Peer:
    peer_id: str
    first_seen: float
    last_seen: float = 0.0
    model: str = ""
    tokenizer: str = ""
    policy_version: int = 0
    families: dict[str, int] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    groups: int = 0
    verified: _Stat = field(default_factory=_Stat)
    solved: int = 0  # completions whose answer is exactly right
    hint: _Stat = field(default_factory=_Stat)
    hinted_verified: _Stat = field(default_factory=_Stat)  # verified rewards of completions that carry a hint
    series: deque = field(default_factory=deque)  # (t, verified_mean, hint_mean|None, n) per record
    kinds: dict[str, int] = field(default_factory=dict)
    evals: deque = field(default_factory=deque)
    recent: deque = field(default_factory=deque)  # the peer's latest completions (first of each group)


class _Buckets:
    """Fixed-width time buckets holding a few named sums, oldest dropped beyond ``cap``."""

    def __init__(self, width: float, cap: int):
        self.width = width
        self.cap = cap
        self.rows: OrderedDict[int, dict[str, float]] = OrderedDict()

    def add(self, t: float, **values: float) -> None:
        b = int(t // self.width)
        row = self.rows.get(b)
        if row is None:
            row = self.rows[b] = {}
            while len(self.rows) > self.cap:
                self.rows.popitem(last=False)
        for k, v in values.items():
            row[k] = row.get(k, 0.0) + v

    def points(self) -> list[dict[str, float]]:
        return [{"t": b * self.width, **row} for b, row in self.rows.items()]


class SwarmObserver:
    """Validated, re-scored, aggregated view of a swarm; feed it raw record bytes, read :meth:`state`."""

    def __init__(
        self,
        validator: RecordValidator,
        *,
        limits: ObserverLimits | None = None,
        tasks: BoundedTasks | None = None,
        clock: Callable[[], float] = time.time,
    ):
        import swarm.evals
        import swarm.scores  # noqa: F401  (registers the ``scores`` kind, so MNPO records validate as on a node)

        self.validator = validator
        self.limits = limits or ObserverLimits()
        self.tasks = tasks or BoundedTasks(self.limits)
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self._families: dict[str, _Stat] = {}
        self._family_series: dict[str, _Buckets] = {}
        self._traffic = _Buckets(self.limits.bucket_s, self.limits.series_points)
        self._peer_counts: deque = deque(maxlen=self.limits.series_points)
        self.duplicates = 0
        self._recent_n = 0
        self.fed = 0
        self.bytes_in = 0
        self.groups_unscored = 0
        self.transport: dict[str, Any] = {}

    # -- input --------------------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> Envelope | None:
        """Validate one record's bytes and account for it; returns its envelope if accepted. Never raises.

        Call from one thread at a time (the reader's frames arrive in order). Validation and re-scoring run
        without the lock, so :meth:`state` is never kept waiting by a slow verifier; only the accounting holds it.
        """
        try:
            now = self.clock()
            env = self._validate(data)
            if env is None:
                return None
            scored = (
                self._score(env.payload) if env.kind == "rollouts" and isinstance(env.payload, RolloutBatch) else []
            )
            with self._lock:
                self._account(env, scored, now)
            return env
        except Exception:  # bad peer data must never take the observer down
            logger.exception("observer failed on a record; dropped")
            return None

    def _validate(self, data: bytes) -> Envelope | None:
        self.fed += 1
        self.bytes_in += len(data) if isinstance(data, bytes | bytearray) else 0
        digest = hashlib.sha256(data).digest() if isinstance(data, bytes | bytearray) else b""
        if digest and digest in self._seen:
            self.duplicates += 1
            return None
        if digest:
            self._seen[digest] = None
            while len(self._seen) > 200_000:
                self._seen.popitem(last=False)
        return self.validator.check(data)

    def _score(self, batch: RolloutBatch) -> list[tuple[Group, list[float], list[bool]]]:
        """Each group's verified rewards and exact flags (groups beyond the cap and refused refs are counted and left
        out)."""
        out = []
        for gi, group in enumerate(batch.groups):
            if gi >= self.limits.max_groups_per_record:
                self.groups_unscored += len(batch.groups) - gi
                break
            verdict = self.tasks.score(group.task, [c.text for c in group.completions])
            if verdict is not None:
                out.append((group, *verdict))
        return out

    def _account(self, env: Envelope, scored: list[tuple[Group, list[float], list[bool]]], now: float) -> None:
        peer = self._peer(env.sender, now)
        peer.records += 1
        peer.bytes += env.size
        peer.kinds[env.kind] = peer.kinds.get(env.kind, 0) + 1
        self._traffic.add(now, records=1, bytes=env.size)
        if env.kind == "rollouts" and isinstance(env.payload, RolloutBatch):
            self._rollouts(peer, env.payload, scored, now)
        elif env.kind == "eval":
            peer.evals.append({"t": now, **_eval_summary(env.payload)})
            while len(peer.evals) > 50:
                peer.evals.popleft()

    def _peer(self, sender: str, now: float) -> _Peer:
        peer = self._peers.get(sender)
        if peer is None:
            peer = self._peers[sender] = _Peer(sender, first_seen=now)
            while len(self._peers) > self.limits.max_peers:
                self._peers.popitem(last=False)
        self._peers.move_to_end(sender)
        peer.last_seen = now
        return peer

    def _rollouts(
        self, peer: _Peer, batch: RolloutBatch, scored: list[tuple[Group, list[float], list[bool]]], now: float
    ) -> None:
        peer.model, peer.tokenizer, peer.policy_version = batch.model, batch.tokenizer, batch.policy_version
        rec_verified, rec_hint = _Stat(), _Stat()
        for group, rewards, exact in scored:
            ref = group.task
            peer.groups += 1
            peer.families[ref.family] = peer.families.get(ref.family, 0) + 1
            rec_verified.add(rewards)
            peer.verified.add(rewards)
            peer.solved += sum(exact)  # exactly right (partial credit does not count)
            fam = self._families.setdefault(ref.family, _Stat())
            fam.add(rewards)
            series = self._family_series.setdefault(
                ref.family, _Buckets(self.limits.bucket_s, self.limits.series_points)
            )
            series.add(now, total=math.fsum(rewards), n=len(rewards))
            for c, r in zip(group.completions, rewards, strict=True):
                h = c.reward_hint
                if h is not None and math.isfinite(h):
                    rec_hint.add([h])
                    peer.hint.add([h])
                    peer.hinted_verified.add([r])
            c, r = group.completions[0], rewards[0]
            self._recent_n += 1
            peer.recent.append(
                {
                    "n": self._recent_n,
                    "t": now,
                    "peer": peer.peer_id,
                    "family": ref.family,
                    "index": ref.index,
                    "text": c.text[:TEXT_PREVIEW_CHARS],
                    "verified": r,
                    "hint": c.reward_hint if c.reward_hint is None or math.isfinite(c.reward_hint) else None,
                }
            )
            while len(peer.recent) > self.limits.recent_per_peer:
                peer.recent.popleft()
        if rec_verified.n:
            peer.series.append((now, rec_verified.mean(), rec_hint.mean(), rec_verified.n))
            while len(peer.series) > self.limits.series_points:
                peer.series.popleft()

    def set_transport_stats(self, stats: dict[str, Any]) -> None:
        """Latest counters from the transport (peers reachable, store-time refusals by reason)."""
        with self._lock:
            self.transport = dict(stats)

    def tick(self) -> None:
        """Sample the number of active peers (call every few seconds)."""
        with self._lock:
            now = self.clock()
            active = sum(1 for p in self._peers.values() if p.last_seen >= now - self.limits.active_s)
            dht = self.transport.get("dht_peers")
            self._peer_counts.append({"t": now, "active": active, "seen": len(self._peers), "dht": dht})

    # -- output -------------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything the page shows, as one JSON-able dict (times are unix seconds)."""
        with self._lock:
            now = self.clock()
            peers = [self._peer_state(p, now) for p in self._peers.values()]
            refusals = {k: v for k, v in dict(self.validator.rejected).items() if v}  # dict(): one atomic copy
            task_refusals = dict(self.tasks.refused)
            if self.groups_unscored:
                task_refusals["groups_unscored"] = self.groups_unscored
            traffic = self._traffic.points()
            return {
                "swarm": self.validator.swarm_id,
                "now": now,
                "started": self.started,
                "bucket_s": self.limits.bucket_s,
                "records_fed": self.fed,
                "records_accepted": self.validator.accepted,
                "duplicates": self.duplicates,
                "bytes_in": self.bytes_in,
                "peers": sorted(peers, key=lambda p: p["first_seen"]),
                "families": {
                    name: {
                        "verified": stat.mean(),
                        "n": stat.n,
                        "series": [
                            {"t": pt["t"], "verified": pt["total"] / pt["n"], "n": int(pt["n"])}
                            for pt in self._family_series[name].points()
                            if pt["n"]
                        ],
                    }
                    for name, stat in sorted(self._families.items())
                },
                "traffic": [
                    {"t": pt["t"], "records": int(pt.get("records", 0)), "bytes": int(pt.get("bytes", 0))}
                    for pt in traffic
                ],
                "peer_counts": list(self._peer_counts),
                "refusals": {"validator": refusals, "tasks": task_refusals, "transport": self._store_refusals()},
                "transport": {k: v for k, v in self.transport.items() if k != "rejections"},
                "recent": self._recent_completions(),
                "tasks_built": self.tasks.built,
            }

    def _recent_completions(self) -> list[dict[str, Any]]:
        peers = list(self._peers.values())[-self.limits.recent_peers :]  # ordered by last seen
        return sorted((r for p in peers for r in p.recent), key=lambda r: r["n"], reverse=True)

    def _store_refusals(self) -> dict[str, int]:
        rej = self.transport.get("rejections") or {}
        return {str(k): int(v) for k, v in rej.items() if isinstance(v, int) and v}

    def _peer_state(self, p: _Peer, now: float) -> dict[str, Any]:
        verified, hint = p.verified.mean(), p.hint.mean()
        gap = None
        if hint is not None and p.hinted_verified.n >= GAP_MIN_COMPLETIONS:
            v = p.hinted_verified.mean() or 0.0
            se = math.sqrt(max(v * (1 - v), 1e-4) / p.hinted_verified.n)
            gap = abs(hint - v) > max(GAP_MIN, 3 * se)
        return {
            "peer": p.peer_id,
            "model": p.model,
            "tokenizer": p.tokenizer,
            "policy_version": p.policy_version,
            "families": dict(sorted(p.families.items())),
            "kinds": dict(p.kinds),
            "records": p.records,
            "bytes": p.bytes,
            "groups": p.groups,
            "completions": p.verified.n,
            "verified": verified,
            "solve_rate": p.solved / p.verified.n if p.verified.n else None,
            "hint": hint,
            "gap": gap,
            "first_seen": p.first_seen,
            "last_seen": p.last_seen,
            "active": p.last_seen >= now - self.limits.active_s,
            "series": [{"t": t, "verified": v, "hint": h, "n": n} for t, v, h, n in p.series],
            "eval": list(p.evals)[-1] if p.evals else None,
        }


def _eval_summary(payload: Any) -> dict[str, Any]:
    """The JSON-able fields of an ``eval`` payload (whatever object its registered decoder returns)."""
    to_dict = getattr(payload, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else {}
