"""swarm.mnpo: windows, the response store, cross-score coverage, opponent selection and pair choice."""

import random

from protocol.identity import Identity
from protocol.types import Completion, Envelope, Group, RolloutBatch, TaskRef
from swarm.mnpo import (
    History,
    Pair,
    Response,
    ResponseStore,
    ScoreBook,
    choose_pairs,
    ingest_window_rollouts,
    mnpo_window,
    pair_stats,
    score_sample,
    select_opponents,
    window_rng,
)
from swarm.pool import SELF
from swarm.scores import ScoreBatch, response_hash

T1 = TaskRef("chain_sum", {}, 0, 1)
T2 = TaskRef("chain_sum", {}, 0, 2)


def resp(task, text, source=SELF, window=3):
    return Response(response_hash(task, text), task, text, source, window)


def test_windows_and_shared_prompts():
    assert mnpo_window(10, 1) == 10 and mnpo_window(10, 4) == 2
    a = [window_rng("s", 0, 7).random() for _ in range(2)]
    assert a == [window_rng("s", 0, 7).random() for _ in range(2)]
    assert window_rng("s", 0, 8).random() != a[0] and window_rng("t", 0, 7).random() != a[0]


def test_store_dedups_caps_senders_and_prunes():
    s = ResponseStore(keep_windows=2, max_per_sender=2)
    assert s.add(resp(T1, "a")) == "added"
    assert s.add(resp(T1, "a", source="p")) == "duplicate"
    assert s.add(resp(T1, "b", source="p")) == "added"
    assert s.add(resp(T1, "c", source="p")) == "added"
    assert s.add(resp(T1, "d", source="p")) == "sender_cap"
    s.add(resp(T2, "x", window=4))
    assert len(s) == 4 and set(s.by_task()) == {T1.key(), T2.key()}
    s.prune(4)
    assert len(s) == 4
    s.prune(5)
    assert [r.text for r in s.responses()] == ["x"]


def _env(sender_ident, groups, seq=1):
    return Envelope(
        1,
        "rollouts",
        "s",
        sender_ident.peer_id,
        sender_ident.public_bytes,
        seq,
        0,
        0.0,
        RolloutBatch("m", 0, "t", tuple(groups)),
    )


def test_ingest_takes_only_window_prompts():
    peer = Identity.from_private_bytes(bytes(32))
    other = TaskRef("chain_sum", {}, 0, 99)
    g1 = Group(T1, (Completion("a", 1), Completion("b", 1)))
    g2 = Group(other, (Completion("z", 1),))
    s = ResponseStore()
    counts = ingest_window_rollouts(s, _env(peer, [g1, g2]), {T1.key(): 3})
    assert counts["added"] == 2 and len(s) == 2
    assert all(r.source == peer.peer_id and r.window == 3 for r in s.responses())
    assert ingest_window_rollouts(s, _env(peer, [g1]), {T1.key(): 3})["duplicate"] == 2


def test_score_sample_is_the_same_for_every_player():
    rs = [resp(T1, str(i)) for i in range(50)]
    a = score_sample(rs, 10, "w3")
    b = score_sample(list(reversed(rs)), 10, "w3")
    assert [r.hash for r in a] == [r.hash for r in b] and len(a) == 10
    assert score_sample(rs[:5], 10, "w3") == rs[:5]


def test_scorebook_keeps_latest_per_peer_and_covers():
    a, b = resp(T1, "a"), resp(T1, "b")
    c = resp(T1, "c")
    book = ScoreBook()
    assert book.add("p1", 5, ScoreBatch(3, "m", "t", 1, (a.hash, b.hash), (-1.0, -2.0)))
    assert book.add("p2", 1, ScoreBatch(3, "m", "t", 1, (a.hash, c.hash), (-1.0, -2.0)))
    assert not book.add("p1", 4, ScoreBatch(3, "m", "t", 0, (a.hash, b.hash, c.hash), (-1.0, -2.0, -3.0)))
    cov = book.covering(a.hash, b.hash)
    assert [(o.name, o.lp_w, o.lp_l, o.kind) for o in cov] == [("p1", -1.0, -2.0, "peer")]
    assert book.add("p1", 6, ScoreBatch(3, "m", "t", 2, (c.hash,), (-0.5,)))  # newer record replaces whole
    assert book.covering(a.hash, b.hash) == []
    book.prune(4)
    assert len(book) == 0


def test_history_is_bounded_newest_first():
    a, b = resp(T1, "a"), resp(T1, "b")
    h = History(2)
    for v in range(4):
        h.record(v, {a.hash: -float(v), b.hash: -10.0})
    cov = h.covering(a.hash, b.hash)
    assert [o.name for o in cov] == ["self@3", "self@2"] and cov[0].kind == "self"


def test_opponent_selection_peers_then_history_fallback():
    a, b = resp(T1, "a"), resp(T1, "b")
    book, hist = ScoreBook(), History(4)
    for i in range(3):
        book.add(f"p{i}", 1, ScoreBatch(3, "m", "t", 0, (a.hash, b.hash), (-1.0, -1.5 - i)))
    hist.record(7, {a.hash: -1.0, b.hash: -1.1})
    hist.record(8, {a.hash: -1.0, b.hash: -1.2})
    kw = dict(book=book, history=hist, rng=random.Random(0))
    ht = select_opponents(a.hash, b.hash, source="peers", max_opponents=4, **kw)
    assert [o.kind for o in ht] == ["peer", "peer", "peer", "self"] and ht[3].name == "self@8"
    capped = select_opponents(a.hash, b.hash, source="peers", max_opponents=2, **kw)
    assert len(capped) == 2 and all(o.kind == "peer" for o in capped)
    td = select_opponents(a.hash, b.hash, source="history", max_opponents=4, **kw)
    assert [o.name for o in td] == ["self@8", "self@7"]
    assert select_opponents(a.hash, b.hash, source="none", max_opponents=4, **kw) == []
    # a pair no peer covers falls back to history alone
    c = resp(T1, "c")
    hist.record(8, {c.hash: -3.0})
    fb = select_opponents(a.hash, c.hash, source="peers", max_opponents=4, **kw)
    assert [o.name for o in fb] == ["self@8"]


def test_choose_pairs_prefers_coverage_and_dedups():
    from swarm.mnpo import Opponent

    rs = [resp(T1, str(i)) for i in range(4)]
    peer = Opponent("p", "peer", -1.0, -2.0)
    me = Opponent("self@1", "self", -1.0, -2.0)
    cands = [
        Pair(rs[0], rs[1]),
        Pair(rs[1], rs[0], (peer,)),  # same pair, other direction: kept once (first seen)
        Pair(rs[2], rs[3], (me,)),
        Pair(rs[0], rs[3], (peer, me)),
    ]
    got = choose_pairs(cands, 2, random.Random(0))
    assert [(p.win.text, p.lose.text) for p in got] == [("0", "3"), ("2", "3")]
    stats = pair_stats(got)
    assert stats["mnpo_pairs"] == 2 and stats["mnpo_peer_opponents"] == 0.5 and stats["mnpo_covered_frac"] == 1.0
    assert pair_stats([])["mnpo_pairs"] == 0
    # a decisive pair (a right answer over a wrong one) goes before any coverage; sim games make none and keep the
    # order above
    decisive = Pair(rs[1], rs[2], decisive=True)
    got = choose_pairs([*cands, decisive], 2, random.Random(0))
    assert [(p.win.text, p.lose.text) for p in got] == [("1", "2"), ("0", "3")]
