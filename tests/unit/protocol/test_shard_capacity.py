"""SPEC 7.4: the work stamp, a shard key's capacity and retention rule (memory network and hivemind storage alike),
and a reader that finds a stamped newcomer in a shard filled with free, unstamped entries."""

from __future__ import annotations

import msgpack
import pytest

from protocol.identity import Identity
from protocol.layout import (
    SHARD_CAPACITY,
    UNSTAMPED_RANK,
    IndexWriter,
    ShardParams,
    ShardReader,
    decode_index_entry,
    encode_index_entry,
    mint_work,
    record_digest_hex,
    work_bits,
    work_rank,
)
from protocol.transport.config import ProtocolConfig
from protocol.transport.memory import MemoryNetwork, MemoryTransport

SWARM = "s"
W = 10


def ident(i: int) -> Identity:
    return Identity.from_private_bytes(i.to_bytes(4, "big") * 8)


def test_a_stamp_carries_the_bits_it_was_minted_for_and_only_for_its_window_and_sender():
    me = ident(1).peer_id
    nonce = mint_work(SWARM, W, me, 10)
    assert work_bits(work_rank(SWARM, W, me, nonce)) >= 10
    entry = decode_index_entry(encode_index_entry(ident(1), SWARM, W, ["00" * 16], work=nonce))
    assert entry.work == nonce and entry.rank == work_rank(SWARM, W, me, nonce)
    # The same nonce for another window or sender is no stamp (1 in 1,024 would be by chance: these are not).
    assert work_bits(work_rank(SWARM, W + 1, me, nonce)) < 10
    assert work_bits(work_rank(SWARM, W, ident(2).peer_id, nonce)) < 10
    assert decode_index_entry(encode_index_entry(ident(1), SWARM, W, ["00" * 16])).rank == UNSTAMPED_RANK


async def _publish(t: MemoryTransport, writer: IndexWriter, data: bytes) -> None:
    await t.publish(data, window=W, sender=writer.identity.peer_id, index=writer.add(data, W))


async def test_memory_shard_key_is_capped_and_keeps_a_stamped_newcomer_over_a_free_flood():
    net = MemoryNetwork()
    cfg = ProtocolConfig()
    flood = MemoryTransport(net, "flood", protocol=cfg)
    n = SHARD_CAPACITY + 72
    for i in range(n):  # unstamped entries: every level (the writer has not polled), so level 0 fills first
        await _publish(flood, IndexWriter(ident(100 + i), SWARM, work_bits=None), f"flood {i}".encode())
    level0 = net._shards[(W, 0, 0)]
    assert len(level0) == SHARD_CAPACITY and net.refused["shard_full"] >= n - SHARD_CAPACITY
    newcomer = IndexWriter(ident(7), SWARM)  # stamped, as every honest channel's entries are
    pub = MemoryTransport(net, "newcomer", protocol=cfg)
    await _publish(pub, newcomer, b"honest record")
    assert len(level0) == SHARD_CAPACITY and ident(7).peer_id in level0
    assert net.evicted["outranked"] == 1
    # A reader's first poll reads level 0: the stamped entry comes first among senders it does not follow, and its
    # size estimate counts stamped entries only (one), so it stays at level 0 instead of walking thousands of shards.
    reader = MemoryTransport(net, "reader", protocol=cfg, swarm=SWARM, seed=3)
    got = await reader.fetch_recent([W - 1, W, W + 1])
    assert b"honest record" in got
    assert reader.stats()["read_level"] == 0


async def test_a_second_flood_of_stamped_entries_evicts_only_worse_ones():
    net = MemoryNetwork()
    t = MemoryTransport(net, "t", protocol=ProtocolConfig(index_work_bits=4))
    for i in range(SHARD_CAPACITY):
        await _publish(t, IndexWriter(ident(100 + i), SWARM, work_bits=4), f"weak {i}".encode())
    strong = IndexWriter(ident(9), SWARM, work_bits=20)
    await _publish(t, strong, b"strong")
    level0 = net._shards[(W, 0, 0)]
    assert ident(9).peer_id in level0 and len(level0) == SHARD_CAPACITY
    worst = max(lst.rank for lst in level0.values())
    late = IndexWriter(ident(5000), SWARM, work_bits=None)
    await _publish(t, late, b"late and unstamped")
    assert ident(5000).peer_id not in level0 and max(lst.rank for lst in level0.values()) == worst


def _junk(i: int, data: bytes, bar: int = 12) -> bytes:
    """An entry of identity ``i`` listing ``data`` with a free nonce: the first one whose work is below ``bar``."""
    me = ident(i)
    nonce = next(n for n in range(1 << 20) if work_bits(work_rank(SWARM, W, me.peer_id, n)) < bar)
    return encode_index_entry(me, SWARM, W, [record_digest_hex(data)], work=nonce)


def test_work_below_the_bar_ranks_as_no_work():
    me = ident(1).peer_id
    junk = decode_index_entry(_junk(1, b"x"))
    assert junk.work is not None and junk.rank < UNSTAMPED_RANK  # any nonce's hash is below 2**256 ...
    assert junk.rank_at(12) == UNSTAMPED_RANK  # ... but below the bar it is no work at all
    assert junk.rank_at(0) == junk.rank  # a bar of 0 counts every nonce
    nonce = mint_work(SWARM, W, me, 12)
    assert work_rank(SWARM, W, me, nonce, 12) == work_rank(SWARM, W, me, nonce) < UNSTAMPED_RANK


async def test_a_flood_of_free_work_cannot_push_unstamped_entries_out_of_a_full_key():
    """The independent client's finding (issue 56): junk ``work`` below ``index_work_bits`` outranked unstamped
    entries and took every slot of the level-0 key. Below the bar it is no work: the first entries stay."""
    net = MemoryNetwork()
    t = MemoryTransport(net, "t", protocol=ProtocolConfig())
    for i in range(SHARD_CAPACITY):  # honest but unstamped (2.0 writers, or work_bits None)
        await _publish(t, IndexWriter(ident(100 + i), SWARM, work_bits=None), f"honest {i}".encode())
    level0 = net._shards[(W, 0, 0)]
    honest = set(level0)
    for i in range(200):
        data = f"junk {i}".encode()
        await t.publish(data, window=W, sender=ident(1000 + i).peer_id, index=_junk(1000 + i, data))
    assert set(level0) == honest and net.evicted["outranked"] == 0
    assert net.refused["shard_full"] >= 200


def test_hivemind_storage_refuses_free_work_into_a_full_key_of_unstamped_entries():
    pytest.importorskip("hivemind")
    from hivemind.dht.routing import DHTID
    from hivemind.utils import get_dht_time

    from protocol.transport.hivemind.capacity import CappedStorage

    storage = CappedStorage(work_bits=12)
    key = DHTID.generate(source="s/shard/10/0/0")
    exp = get_dht_time() + 60
    for i in range(SHARD_CAPACITY):
        entry = IndexWriter(ident(100 + i), SWARM, work_bits=None).add(f"honest {i}".encode(), W)
        assert storage.store(key, msgpack.packb(entry, use_bin_type=True), exp, subkey=ident(100 + i).peer_id)
    for i in range(50):
        junk = msgpack.packb(_junk(1000 + i, f"junk {i}".encode()), use_bin_type=True)
        assert not storage.store(key, junk, exp, subkey=ident(1000 + i).peer_id)
    assert storage.counts["shard_full"] == 50 and sum(storage.evicted.values()) == 0


def test_hivemind_storage_caps_a_shard_key_and_serves_less_than_one_p2pd_message():
    pytest.importorskip("hivemind")
    from hivemind.dht.routing import DHTID
    from hivemind.dht.storage import DictionaryDHTValue
    from hivemind.utils import get_dht_time
    from hivemind.utils.serializer import MSGPackSerializer

    from protocol.transport.hivemind.capacity import CappedStorage

    storage = CappedStorage()
    key = DHTID.generate(source="s/shard/10/0/0")
    exp = get_dht_time() + 60
    digests = [f"{i:032x}" for i in range(64)]  # the flood: 64 digests per entry (~1.2 KB)

    def value(writer: IndexWriter, i: int) -> bytes:
        entry = encode_index_entry(writer.identity, SWARM, W, digests, work=writer.stamp(W))
        return bytes(msgpack.packb(entry, use_bin_type=True))

    n = SHARD_CAPACITY + 50
    for i in range(n):
        storage.store(
            key, value(IndexWriter(ident(100 + i), SWARM, work_bits=None), i), exp, subkey=ident(100 + i).peer_id
        )
    held = storage.get(key).value
    assert len(held) == SHARD_CAPACITY and storage.counts["shard_full"] == n - SHARD_CAPACITY
    honest = IndexWriter(ident(7), SWARM)
    assert storage.store(key, value(honest, 0), exp, subkey=ident(7).peer_id)
    assert ident(7).peer_id in storage.get(key).value and len(storage.get(key).value) == SHARD_CAPACITY
    # What a peer's lookup of this key returns (hivemind serializes the whole dictionary into one message).
    wire = MSGPackSerializer.dumps(storage.get(key).value)
    assert len(wire) < 4 * 1024 * 1024 and storage.max_bytes <= SHARD_CAPACITY * 2048
    # A merged lookup result cached whole is trimmed to what a replica would keep, the stamped entry first.
    merged = DictionaryDHTValue()
    for i in range(n):
        merged.store(ident(100 + i).peer_id, value(IndexWriter(ident(100 + i), SWARM, work_bits=None), i), exp)
    merged.store(ident(7).peer_id, value(honest, 0), exp)
    cache = CappedStorage()
    cache.store(key, merged, exp)
    assert len(cache.get(key).value) == SHARD_CAPACITY and ident(7).peer_id in cache.get(key).value
    # Both ways of dropping a held entry are counted, by reason (issue 56: evictions were silent).
    assert storage.evicted == {"outranked": 1} and cache.evicted == {"trimmed": n + 1 - SHARD_CAPACITY}


async def test_a_reader_gives_up_on_senders_whose_entries_do_not_resolve():
    """Dangling entries (digests nobody stored) are tried after every other sender, and dropped after 3 misses."""
    writers = [IndexWriter(ident(100 + i), SWARM, work_bits=None) for i in range(20)]
    entries = [[w.add(f"never stored {i}/{j}".encode(), W) for j in range(10)][-1] for i, w in enumerate(writers)]
    reader = ShardReader(SWARM, ShardParams(), seed=1)
    asked: list[str] = []

    async def shards(addrs):
        return {a: list(entries) for a in addrs}

    async def peers(addrs):
        return {}

    async def records(addrs):
        asked.extend(a[1] for a in addrs)
        return {}

    for _ in range(40):
        await reader.poll([W], [], shards, peers, records)
    per_sender = {s: asked.count(s) for s in set(asked)}
    # each sender lists 10 digests (30 fetches before a per-digest give-up); the sender is dropped after 3
    assert len(per_sender) == 20 and max(per_sender.values()) == 3


async def test_a_stamped_sender_whose_first_fetch_failed_is_read_first_again():
    """A record not yet visible where the reader asked (its index entry arrived first) is retried at the next poll
    ahead of unstamped senders, not sent to the back with the dangling ones."""
    writers = [IndexWriter(ident(100 + i), SWARM, work_bits=None) for i in range(40)]
    entries = [w.add(f"never stored {i}".encode(), W) for i, w in enumerate(writers)]
    newcomer = IndexWriter(ident(7), SWARM, work_bits=4)
    entries.append(newcomer.add(b"late record", W))
    reader = ShardReader(SWARM, ShardParams(work_bits=4), seed=2)
    visible = False
    asked: list[list[str]] = []

    async def shards(addrs):
        return {a: list(entries) for a in addrs}

    async def peers(addrs):
        return {}

    async def records(addrs):
        asked.append([a[1] for a in addrs])
        if visible:
            return {a: [b"late record"] for a in addrs if a[1] == ident(7).peer_id}
        return {}

    await reader.poll([W], [], shards, peers, records)
    visible = True
    got = await reader.poll([W], [], shards, peers, records)
    assert ident(7).peer_id in asked[0] and ident(7).peer_id in asked[1]
    assert b"late record" in got
