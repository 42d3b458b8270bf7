"""The sharded layout: signed bounded index entries, shards and levels, bounded reads, index floods, reach."""

import pytest

from protocol.codec import RecordDecodeError, RecordSignatureError
from protocol.identity import Identity
from protocol.layout import (
    MAX_INDEX_DIGESTS,
    SHARD_CAPACITY,
    IndexWriter,
    ShardParams,
    ShardWalk,
    decode_index_entry,
    encode_index_entry,
    expected_reach,
    record_digest_hex,
    shard_of,
)
from protocol.transport.config import ProtocolConfig
from protocol.transport.memory import MemoryNetwork, MemoryTransport

SWARM = "s"


def ident(i: int) -> Identity:
    return Identity.from_private_bytes(bytes([i % 256, i // 256]) * 16)


def test_index_entry_round_trip_and_tamper():
    me = ident(1)
    entry = encode_index_entry(me, SWARM, 7, ["00" * 16, "11" * 16])
    dec = decode_index_entry(entry)
    assert (dec.sender, dec.window, dec.digests) == (me.peer_id, 7, ("00" * 16, "11" * 16))
    bad = bytearray(entry)
    bad[-1] ^= 1
    with pytest.raises(RecordSignatureError):
        decode_index_entry(bytes(bad))
    with pytest.raises(RecordDecodeError):
        decode_index_entry(b"junk")
    with pytest.raises(ValueError):
        encode_index_entry(me, SWARM, 7, ["00" * 16] * 2)  # repeated digests


def test_writer_bounds_one_sender_per_window():
    w = IndexWriter(ident(2), SWARM)
    for i in range(MAX_INDEX_DIGESTS):
        assert w.add(bytes([i]) * 10, 5) is not None
    assert w.add(b"one too many", 5) is None  # stored but not listed: a sender cannot grow its entry further
    assert decode_index_entry(w.add(bytes([0]) * 10, 5)).count == MAX_INDEX_DIGESTS


def test_shards_nest_and_levels_track_swarm_size():
    p = ShardParams()
    for sender in (ident(i).peer_id for i in range(20)):
        for level in range(1, p.levels):
            assert shard_of(9, sender, level, p.fanout) % p.shards(level - 1) == shard_of(9, sender, level - 1, 4)
    assert p.level_for(10) == 0 and p.level_for(12) == 0
    assert [p.level_for(n) for n in (100, 1000, 10_000)] == [2, 4, 5]
    # Whatever N, one poll's discovery reads at most poll_senders entries per window (on average).
    for n in (10, 100, 1000, 10_000):
        assert min(p.poll_shards, p.shards(p.level_for(n))) * n / p.shards(p.level_for(n)) <= p.poll_senders


def test_expected_reach_arithmetic():
    p = ShardParams()
    assert expected_reach(10, p, 1) == 1.0  # a small swarm is read whole every poll
    r100 = [expected_reach(100, p, k) for k in (1, 2, 4)]
    assert r100 == sorted(r100) and 0 < r100[0] < 1
    # Readers per record per poll stay about constant, so the share falls like 1/N.
    assert expected_reach(10_000, p, 1) * 10_000 == pytest.approx(expected_reach(1000, p, 1) * 1000, rel=0.5)
    # With budget to spare a reader has walked every shard of its level within S/m polls: 32 senders -> 4 shards.
    assert p.shards(p.level_for(32)) == 4
    f = 6 / 31  # the sender's followers fetch at once; the others read its shard at one of their next 4 polls
    want = [f + (1 - f) * k / 4 for k in (1, 2, 4)]
    assert [expected_reach(32, p, k, records_per_poll=0.1) for k in (1, 2, 4)] == pytest.approx(want)
    # A binding budget: each read of the shard fetches the record with probability q < 1, so reach stays below 1.
    assert 0.6 < expected_reach(32, p, 4, records_per_poll=1.0) < 0.8


def test_a_writer_writes_around_its_reading_level_and_the_top():
    from protocol.layout import ShardReader

    r = ShardReader(SWARM, ShardParams())
    assert r.write_levels() == list(range(7))  # no estimate yet: every level
    for n, levels in ((5, [0, 1, 6]), (32, [0, 1, 2, 6]), (100, [1, 2, 3, 6]), (10_000, [4, 5, 6]), (1e6, [5, 6])):
        r.estimate = n
        assert r.write_levels() == levels
        # every reader whose estimate is within a factor fanout of the writer's reads a level the writer wrote
        for other in (n / 4, n, n * 4):
            assert r.p.level_for(other) in levels


@pytest.mark.parametrize("n", [1, 2, 4, 16, 1024, 4**9])
def test_a_walk_reads_every_shard_once_per_cycle(n):
    import random

    walk = ShardWalk(n, random.Random(n))
    for k in (1, 3):
        polls = [walk.take(k) for _ in range(max(1, min(n, 4096) // k))]
        assert all(len(set(shards)) == len(shards) == min(k, n) for shards in polls)
        if n <= 4096 and n % k == 0:  # whole cycles: each shard exactly once
            seen = [s for shards in polls for s in shards]
            assert sorted(seen) == list(range(n)) * (len(seen) // n)
    if n >= 16:  # the order is the reader's own: other seeds walk other orders
        orders = {tuple(ShardWalk(n, random.Random(seed)).take(4)) for seed in range(5)}
        assert len(orders) == 5


async def publish(t: MemoryTransport, writer: IndexWriter, data: bytes, window: int) -> None:
    await t.publish(data, window=window, sender=writer.identity.peer_id, index=writer.add(data, window))


async def test_network_refuses_forged_and_misfiled_entries():
    net = MemoryNetwork()
    t = MemoryTransport(net, "a")
    me, other = IndexWriter(ident(3), SWARM), IndexWriter(ident(4), SWARM)
    from protocol.errors import TransportError

    with pytest.raises(TransportError, match="key_mismatch"):  # my entry filed under another sender
        await t.publish(b"x", window=1, sender=other.identity.peer_id, index=me.add(b"x", 1))
    with pytest.raises(TransportError, match="index_mismatch"):  # an entry that does not list the record
        await t.publish(b"y", window=1, sender=me.identity.peer_id, index=me.add(b"z", 1))
    with pytest.raises(TransportError, match="bad_signature"):
        bad = bytearray(me.add(b"w", 1))
        bad[-1] ^= 1
        await t.publish(b"w", window=1, sender=me.identity.peer_id, index=bytes(bad))
    await t.publish(b"unlisted", window=1, sender=me.identity.peer_id)
    assert net.refused == {"key_mismatch": 1, "index_mismatch": 1, "bad_signature": 1}
    assert net.stats["unlisted"] == 1 and net.stats["published"] == 0


async def test_poll_cost_is_bounded_whatever_the_swarm_size():
    cfg = ProtocolConfig()
    net = MemoryNetwork()
    pub = MemoryTransport(net, "pub", protocol=cfg)
    for i in range(1000):
        await publish(pub, IndexWriter(ident(i), SWARM), f"record {i}".encode(), 10)
    reader = MemoryTransport(net, "reader", protocol=cfg, swarm=SWARM, seed=1)
    # The first poll knows nothing of the swarm and reads level 0 (here all 1,000 entries: this publisher never
    # polled, so it wrote every level); from its count the reader picks a level for the next polls.
    await reader.fetch_recent([9, 10, 11])
    first = reader.stats()
    for _ in range(4):
        await reader.fetch_recent([9, 10, 11])
    s = reader.stats()
    assert s["records_fetched"] - first["records_fetched"] <= 4 * cfg.poll_records
    # a shard's worth per window per poll (about poll_senders), not 1,000 entries
    assert s["index_entries"] - first["index_entries"] <= 4 * 3 * 2 * cfg.poll_senders
    assert s["read_level"] >= 3


async def test_a_reader_has_every_record_of_a_32_sender_window_after_walking_its_shards():
    """32 senders, one record each: after its first poll (level 0, budget-bound) a reader reads level 1's 4 shards
    one per poll and has every record once it has walked all 4 (independent draws would miss one about 9 times in
    10: 1 - 4!/4**4)."""
    cfg = ProtocolConfig()
    net = MemoryNetwork()
    pub = MemoryTransport(net, "pub", protocol=cfg)
    records = {f"record {i}".encode() for i in range(32)}
    for i, data in enumerate(sorted(records)):
        await publish(pub, IndexWriter(ident(i), SWARM), data, 10)
    for seed in range(5):
        reader = MemoryTransport(net, f"reader{seed}", protocol=cfg, swarm=SWARM, seed=seed)
        await reader.fetch_recent([10])
        levels = []
        for _ in range(4):
            got = await reader.fetch_recent([10])
            levels.append(reader.stats()["read_level"])
        assert levels == [1, 1, 1, 1]
        assert set(got) == records


async def test_a_crowded_shard_is_sampled_not_decoded_whole():
    """A cold start leaves every entry in level 0's one shard, which holds SHARD_CAPACITY of them (SPEC 7.4): a reader
    decodes them, keeps a bounded random sample, counts them all for its size estimate, and at its next poll reads a
    level below that finds the swarm's real size."""
    cfg = ProtocolConfig()
    cap = ShardParams.from_config(cfg).max_shard_entries
    net = MemoryNetwork()
    pub = MemoryTransport(net, "pub", protocol=cfg)
    for i in range(1000):
        await publish(pub, IndexWriter(ident(i), SWARM), f"record {i}".encode(), 10)
    samples = []
    for seed in (1, 2):
        reader = MemoryTransport(net, f"reader{seed}", protocol=cfg, swarm=SWARM, seed=seed)
        got = await reader.fetch_recent([9, 10, 11])
        s = reader.stats()
        assert s["index_entries"] == SHARD_CAPACITY and s["entries_skipped"] == SHARD_CAPACITY - cap
        assert s["swarm_estimate"] >= SHARD_CAPACITY / 2 and s["read_level"] >= 2
        samples.append(set(got))
        await reader.fetch_recent([9, 10, 11])
        assert reader.stats()["swarm_estimate"] >= 300  # halfway from the capped count to the ~1,000 it reads now
    assert samples[0] != samples[1]  # each reader draws its own sample


@pytest.mark.slow
async def test_index_flood_of_10000_delays_a_followed_record_by_at_most_one_poll():
    await _flood(10_000)


async def test_index_flood_delays_a_followed_record_by_at_most_one_poll():
    await _flood(1000)


async def _flood(n: int) -> None:
    """``n`` sybil index entries (each listing a record that does not exist) in the window: a record of a peer
    the reader follows is still fetched by the first poll after it is published."""
    net = MemoryNetwork()
    honest = MemoryTransport(net, "honest")
    hw = IndexWriter(ident(60000), SWARM)
    reader = MemoryTransport(net, "reader", swarm=SWARM, seed=3)
    await publish(honest, hw, b"first", 10)
    assert b"first" in await reader.fetch_recent([9, 10, 11])
    flooder = MemoryTransport(net, "flooder")
    for i in range(n):
        # dangling: the entry is valid and signed, the record it lists was never stored
        w = IndexWriter(ident(i), SWARM)
        entry = w.add(f"dangling {i}".encode(), 10)
        net._store("flooder", 10, w.identity.peer_id, f"dangling {i}".encode(), entry, range(7), 4)
        del net._records[(10, w.identity.peer_id, record_digest_hex(f"dangling {i}".encode()))]
    for _ in range(3):
        await reader.fetch_recent([9, 10, 11], prefer=[hw.identity.peer_id])
    await publish(honest, hw, b"second", 10)
    assert b"second" in await reader.fetch_recent([9, 10, 11], prefer=[hw.identity.peer_id])
    assert flooder.peer_id == "flooder"


async def test_sample_is_the_readers_own_choice():
    """Two readers with different seeds read different shards of a big swarm: nobody else picks the sample."""
    net = MemoryNetwork()
    pub = MemoryTransport(net, "pub")
    for i in range(600):
        await publish(pub, IndexWriter(ident(i), SWARM), f"r{i}".encode(), 10)
    got = []
    for seed in (1, 2):
        r = MemoryTransport(net, f"r{seed}", swarm=SWARM, seed=seed)
        for _ in range(3):
            await r.fetch_recent([9, 10])
        got.append(set(await r.fetch_recent([9, 10])))
    assert got[0] and got[1] and got[0] != got[1]
