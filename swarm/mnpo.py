"""MNPO on the swarm population, the model-free half: windows, pooled responses, cross-scores, pairs, opponents.

Multiplayer Nash Preference Optimization (Wu et al. 2025, arXiv 2509.23102) trains each player against a
population of opponents. On the swarm the players are the nodes:

* **windows** -- MNPO time is the protocol window divided by a span (:func:`mnpo_window`); every player derives the
  same prompt set from the window number (:func:`window_rng`), so the pool holds many players' responses to the
  same prompts;
* **responses** -- own and peers' responses to a window's prompts, by content hash (:class:`ResponseStore`);
* **cross-scores** -- each player's own length-averaged logprobs on a bounded, rendezvous-chosen sample of the pool
  (:func:`score_sample`), published as ``scores`` records (``swarm.scores``) and kept per peer (:class:`ScoreBook`);
  the player's own past versions' scores are its history (:class:`History`, the TD-MNPO opponents, stored as
  logprobs rather than frozen model copies: they cost no memory and no extra forward passes);
* **opponents** -- for a pair ``(y_w, y_l)`` the peers whose latest scores cover both responses (HT-MNPO), topped
  up from the player's own history where peers do not cover it (TD-MNPO) (:func:`select_opponents`);
* **pairs** -- the node's preference oracle proposes pairs; :func:`choose_pairs` keeps the decisive ones (a right
  answer over a wrong one, where the oracle knows exactness), then the best-covered ones.

Knows nothing about models, tokenizers, oracles' internals or the loss (``node.mnpo.phase``, ``node.mnpo.oracles``,
``node.learn.losses``); only the standard library and ``protocol``.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from protocol.types import Envelope, RolloutBatch, TaskRef
from swarm.pool import SELF
from swarm.scores import ScoreBatch, response_hash

logger = logging.getLogger(__name__)

OpponentSource = Literal["peers", "history", "none"]


def mnpo_window(protocol_window: int, span: int) -> int:
    """The MNPO window of a protocol window: ``protocol_window // span`` (all players share the protocol clock)."""
    if span < 1:
        raise ValueError("span must be >= 1")
    return protocol_window // span


def window_rng(swarm_id: str, task_seed: int, window: int) -> random.Random:
    """The RNG every player of ``swarm_id`` uses to draw window ``window``'s shared prompt set."""
    return random.Random(f"mnpo-prompts:{swarm_id}:{task_seed}:{window}")


@dataclass(frozen=True)
class Response:
    """One pooled response: its content hash, prompt, text, who produced it and in which MNPO window."""

    hash: bytes
    task: TaskRef
    text: str
    source: str
    window: int
    finish_reason: str = "stop"
    policy_version: int = 0

    @property
    def local(self) -> bool:
        return self.source == SELF


class ResponseStore:
    """Responses of the last ``keep_windows`` MNPO windows, deduplicated by content hash, bounded per sender.

    ``max_per_sender`` caps what one peer (honest or not) can put in a window; ``max_per_window`` caps the window.
    """

    def __init__(self, *, keep_windows: int = 2, max_per_window: int = 4096, max_per_sender: int = 256) -> None:
        if keep_windows < 1 or max_per_window < 1 or max_per_sender < 1:
            raise ValueError("keep_windows, max_per_window and max_per_sender must be positive")
        self.keep_windows = keep_windows
        self.max_per_window = max_per_window
        self.max_per_sender = max_per_sender
        self._windows: dict[int, OrderedDict[bytes, Response]] = {}
        self._per_sender: dict[int, Counter[str]] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._windows.values())

    def add(self, r: Response) -> str:
        """Store ``r``; returns ``"added"``, ``"duplicate"``, ``"sender_cap"`` or ``"window_full"``."""
        bucket = self._windows.setdefault(r.window, OrderedDict())
        senders = self._per_sender.setdefault(r.window, Counter())
        if r.hash in bucket:
            return "duplicate"
        if senders[r.source] >= self.max_per_sender:
            return "sender_cap"
        if len(bucket) >= self.max_per_window:
            return "window_full"
        bucket[r.hash] = r
        senders[r.source] += 1
        return "added"

    def get(self, h: bytes) -> Response | None:
        for bucket in self._windows.values():
            r = bucket.get(h)
            if r is not None:
                return r
        return None

    def prune(self, current_window: int) -> None:
        """Forget windows older than ``current_window - keep_windows + 1``."""
        for w in [w for w in self._windows if w <= current_window - self.keep_windows]:
            del self._windows[w]
            self._per_sender.pop(w, None)

    def responses(self, windows: Iterable[int] | None = None) -> list[Response]:
        """Responses of ``windows`` (all kept windows if None), in insertion order per window, windows ascending."""
        ws = sorted(self._windows) if windows is None else sorted(set(windows))
        return [r for w in ws for r in self._windows.get(w, {}).values()]

    def by_task(self, windows: Iterable[int] | None = None) -> dict[str, list[Response]]:
        """Responses grouped by prompt (``TaskRef.key()``), the groups pairs are drawn from."""
        out: dict[str, list[Response]] = {}
        for r in self.responses(windows):
            out.setdefault(r.task.key(), []).append(r)
        return out


def ingest_window_rollouts(
    store: ResponseStore, envelope: Envelope, task_windows: Mapping[str, int], *, max_texts: int = 1 << 14
) -> Counter[str]:
    """Add a peer's responses to window prompts (``task_windows``: TaskRef key -> MNPO window) to ``store``.

    Groups for other prompts are ignored (ordinary SAPO traffic). Texts longer than ``max_texts`` characters are
    dropped. Never raises; returns outcome counts.
    """
    counts: Counter[str] = Counter()
    batch = envelope.payload
    if not isinstance(batch, RolloutBatch):
        return counts
    for group in batch.groups:
        window = task_windows.get(group.task.key())
        if window is None:
            continue
        for c in group.completions:
            if len(c.text) > max_texts:
                counts["too_long"] += 1
                continue
            r = Response(
                hash=response_hash(group.task, c.text),
                task=group.task,
                text=c.text,
                source=envelope.sender,
                window=window,
                finish_reason=c.finish_reason,
                policy_version=c.policy_version,
            )
            counts[store.add(r)] += 1
    return counts


def score_sample(responses: Sequence[Response], max_scores: int, salt: str) -> list[Response]:
    """At most ``max_scores`` responses, chosen by rendezvous hashing of ``(salt, hash)``.

    Every player ranks a response the same way, so players with the same pool score the same sample and their
    scores cover the same pairs (independent random samples would rarely cover both responses of a pair).
    """
    if len(responses) <= max_scores:
        return list(responses)
    key = salt.encode()
    ranked = sorted(responses, key=lambda r: hashlib.sha256(key + r.hash).digest())
    return ranked[:max_scores]


@dataclass
class PeerScores:
    """The latest scores record of one peer."""

    sender: str
    seq: int
    window: int
    policy_version: int
    scores: dict[bytes, float]


class ScoreBook:
    """Each peer's latest ``scores`` record of a recent window (a newer record replaces the older one whole, so
    every log-ratio taken from it comes from one policy version). Bounded by ``max_peers`` (oldest dropped)."""

    def __init__(self, *, max_peers: int = 256) -> None:
        if max_peers < 1:
            raise ValueError("max_peers must be positive")
        self.max_peers = max_peers
        self._peers: OrderedDict[str, PeerScores] = OrderedDict()

    def __len__(self) -> int:
        return len(self._peers)

    def peers(self) -> list[str]:
        return list(self._peers)

    def add(self, sender: str, seq: int, batch: ScoreBatch) -> bool:
        """Keep ``batch`` if it is newer (window, then seq) than what ``sender`` sent before."""
        old = self._peers.get(sender)
        if old is not None and (batch.window, seq) <= (old.window, old.seq):
            return False
        self._peers[sender] = PeerScores(sender, seq, batch.window, batch.policy_version, batch.as_dict())
        self._peers.move_to_end(sender)
        while len(self._peers) > self.max_peers:
            self._peers.popitem(last=False)
        return True

    def prune(self, oldest_window: int) -> None:
        """Forget peers whose latest scores are older than ``oldest_window`` (they left, or stopped scoring)."""
        for s in [s for s, p in self._peers.items() if p.window < oldest_window]:
            del self._peers[s]

    def remove(self, sender: str) -> None:
        self._peers.pop(sender, None)

    def covering(self, h_w: bytes, h_l: bytes) -> list[Opponent]:
        """Peers whose latest scores cover both responses, sorted by peer id (deterministic)."""
        out = []
        for s in sorted(self._peers):
            sc = self._peers[s].scores
            if h_w in sc and h_l in sc:
                out.append(Opponent(s, "peer", sc[h_w], sc[h_l]))
        return out


class History:
    """The player's own scores at its last ``size`` policy versions (TD-MNPO opponents, as stored logprobs)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("size must be positive")
        self.size = size
        self._versions: OrderedDict[int, dict[bytes, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._versions)

    def record(self, version: int, scores: Mapping[bytes, float]) -> None:
        """Add ``scores`` computed by policy ``version`` (merged with earlier scores of the same version)."""
        self._versions.setdefault(version, {}).update(scores)
        self._versions.move_to_end(version)
        while len(self._versions) > self.size:
            self._versions.popitem(last=False)

    def covering(self, h_w: bytes, h_l: bytes) -> list[Opponent]:
        """Own past versions with scores on both responses, newest first."""
        out = []
        for v in reversed(self._versions):
            sc = self._versions[v]
            if h_w in sc and h_l in sc:
                out.append(Opponent(f"self@{v}", "self", sc[h_w], sc[h_l]))
        return out


@dataclass(frozen=True)
class Opponent:
    """One opponent of a pair: who (a peer id or ``self@<version>``), and its logprobs on ``y_w`` and ``y_l``."""

    name: str
    kind: Literal["peer", "self"]
    lp_w: float
    lp_l: float


def select_opponents(
    h_w: bytes,
    h_l: bytes,
    *,
    source: OpponentSource,
    book: ScoreBook,
    history: History,
    max_opponents: int,
    rng: random.Random | None = None,
) -> list[Opponent]:
    """The opponents of pair ``(h_w, h_l)``: at most ``max_opponents``, peers before own history.

    * ``peers`` (HT-MNPO): peers whose scores cover the pair (a random subset if more than ``max_opponents``, so no
      fixed peer dominates), then own past versions where peers leave slots free (TD fallback);
    * ``history`` (TD-MNPO): own past versions covering the pair, newest first;
    * ``none``: no opponents (the loss then plays against the reference: IPO / DPO, the two-player baselines).
    """
    if max_opponents < 1 or source == "none":
        return []
    out: list[Opponent] = []
    if source == "peers":
        peers = book.covering(h_w, h_l)
        if len(peers) > max_opponents:
            peers = (rng or random.Random(0)).sample(peers, max_opponents)
        out.extend(peers)
    elif source != "history":
        raise ValueError(f"unknown opponent source {source!r}")
    if len(out) < max_opponents:
        out.extend(history.covering(h_w, h_l)[: max_opponents - len(out)])
    return out


@dataclass(frozen=True)
class Pair:
    """A preference pair on one prompt and its opponents; ``decisive`` when the winner is exactly right and the
    loser is not (the oracle's first key decided it, not a tie-break such as format or length)."""

    win: Response
    lose: Response
    opponents: tuple[Opponent, ...] = ()
    decisive: bool = False

    @property
    def peer_opponents(self) -> int:
        return sum(1 for o in self.opponents if o.kind == "peer")


def choose_pairs(candidates: Sequence[Pair], max_pairs: int, rng: random.Random) -> list[Pair]:
    """At most ``max_pairs`` pairs: decisive ones first, then the best covered (peer opponents, then any opponents),
    ties broken at random; at most one pair per (winner, loser) and no pair reused in both directions. Decisive
    first: when the pool offers more pairs than a step trains on, a pair a tie-break decided (two wrong answers of
    different lengths) must not crowd out one where a right answer beats a wrong one."""
    seen: set[frozenset[bytes]] = set()
    unique = []
    for p in candidates:
        k = frozenset((p.win.hash, p.lose.hash))
        if len(k) == 2 and k not in seen:
            seen.add(k)
            unique.append(p)
    keyed = [(-p.decisive, -p.peer_opponents, -len(p.opponents), rng.random(), i) for i, p in enumerate(unique)]
    keyed.sort()
    return [unique[k[-1]] for k in keyed[:max_pairs]]


def pair_stats(pairs: Sequence[Pair]) -> dict[str, float]:
    """Coverage metrics of a step's pairs: mean peer / own-history opponents per pair, covered fraction, peers."""
    n = max(len(pairs), 1)
    peers = {o.name for p in pairs for o in p.opponents if o.kind == "peer"}
    return {
        "mnpo_pairs": float(len(pairs)),
        "mnpo_peer_opponents": sum(p.peer_opponents for p in pairs) / n,
        "mnpo_self_opponents": sum(len(p.opponents) - p.peer_opponents for p in pairs) / n,
        "mnpo_covered_frac": sum(1 for p in pairs if p.opponents) / n,
        "mnpo_opponent_peers": float(len(peers)),
    }
