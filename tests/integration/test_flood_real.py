"""An index flood against real hivemind DHTs (real p2pd on 127.0.0.1): a newcomer's record is still heard, and no
shard key grows past what one lookup returns (SPEC 7.4; issue 33's attack, smaller).

Two honest peers, a flood process storing dangling, unstamped index entries of fresh identities (64 digests each)
under the shard keys of levels 0, 4, 5 and 6 of a coming window, then a newcomer that publishes one record in that
window. Asserted: both honest peers receive the newcomer's record; the flooded level-0 key, read back through the DHT,
holds at most ``SHARD_CAPACITY`` entries; every honest node's storage held at most that many in any key; full keys
refused flood entries. ``benchmarks/systems/flood.py`` runs the same with 10,000 entries and times it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from protocol.layout import SHARD_CAPACITY
from tests.integration.procs import HivemindPeerProc

pytestmark = [pytest.mark.network, pytest.mark.slow]

FLOOD = 1500
WINDOW_S = 60


class Peer(HivemindPeerProc):
    def __init__(self, name: str, tmp: Path, *args: str) -> None:
        self.out = tmp / f"{name}.jsonl"
        super().__init__(
            ["--swarm", "flood-it", "--window-seconds", str(WINDOW_S), "--out", str(self.out), *args],
            tmp / f"{name}.log",
        )

    def records(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def metrics(self) -> dict:
        path = Path(f"{self.out}.metrics.json")
        return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.timeout(420)
def test_a_newcomer_is_heard_through_an_index_flood_and_no_shard_key_outgrows_its_capacity(tmp_path):
    peers: list[Peer] = []
    try:
        a = Peer("a", tmp_path, "--records", "2", "--poll-s", "1.0", "--duration", "400")
        peers.append(a)
        addr = a.wait_line("ADDR", 120).split()[1]
        b = Peer("b", tmp_path, "--bootstrap", addr, "--records", "2", "--poll-s", "1.0", "--duration", "400")
        peers.append(b)
        b.wait_line("ADDR", 120)
        flood = Peer("flood", tmp_path, "--bootstrap", addr, "--flood", str(FLOOD), "--flood-ahead", "1")
        peers.append(flood)
        window = int(flood.wait_line("FLOOD ", 240).split()[1])
        read_entries = int(flood.wait_line("FLOODREAD", 120).split()[1])
        wait = window * WINDOW_S - time.time() + 0.5
        assert wait > -WINDOW_S / 2, "the flood outlasted its window: the newcomer's window would not be flooded"
        time.sleep(max(0.0, wait))
        newcomer = Peer("newcomer", tmp_path, "--bootstrap", addr, "--tag", "newcomer:", "--records", "1")
        peers.append(newcomer)
        newcomer.wait_line("PUBLISHED", 120)
        deadline = time.monotonic() + 120
        heard = {}
        while time.monotonic() < deadline and len(heard) < 2:
            for p in (a, b):
                if any(str(r.get("head", "")).startswith("newcomer:") for r in p.records()):
                    heard[p.out.name] = True
            time.sleep(0.5)
        assert len(heard) == 2, f"the newcomer's record reached only {sorted(heard)} of the two honest peers"
        assert 0 < read_entries <= SHARD_CAPACITY
        stats = [p.metrics().get("dht_stats", {}) for p in (a, b)]
        assert all(0 < s.get("shard_key_entries_max", 0) <= SHARD_CAPACITY for s in stats), stats
        refused = sum(p.metrics().get("dht_rejections", {}).get("shard_full", 0) for p in (a, b))
        assert refused >= FLOOD - SHARD_CAPACITY  # the level-0 key alone refuses that many at each honest node
    finally:
        for p in peers:
            p.stop()
