"""Sybils against a real node: one honest ``swarm-node join`` node, one honest peer (another real node), and a
sybil process publishing valid, informative records under a fresh throwaway identity each, over real hivemind.

The honest peer joins a swarm the flood already fills, so it starts as a newcomer competing with the sybils for the
one newcomer slot (README, known limits). It must become established, and from then on its groups must make up at
least half of the external groups the node trains on while the flood runs (``external_by_sender`` in its
``metrics.jsonl``; measured 0.75 exactly: 3 of the 4 slots a step). The flood must really reach the learner (some
sybil groups trained on: the newcomer slot is theirs to compete for), or the test proves nothing. Counting the
newcomer phase too (measured 0.46-0.67) would make the share depend on how many of the node's steps that phase
lasts, which is the load on the machine, not the defence.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl
from protocol.identity import Identity
from tests.integration.procs import FAST_JOIN, HivemindPeerProc

pytestmark = [pytest.mark.network]

ROOT = Path(__file__).resolve().parents[2]
JOIN = [*FAST_JOIN, "--set", "model.threads=1", "--set", "eval.every_steps=null", "--set", "eval.at_start=false"]
#: The node under attack trains on 4 peers' groups a step: one newcomer slot (the sybil budget's quarter), three
#: kept for established senders (with 2 the one newcomer slot would already be half of the external data). Its
#: ``max_per_peer`` is 3 so that its one honest peer can fill those three: with the default ceil(4/2) = 2 a single
#: honest peer could never hold more than 2/3 (measured 0.63 and 0.57 in two runs), which tests the per-peer cap,
#: not the sybil budget (README, known limits).
#: It also draws 16 prompts a step, so it steps no faster than its honest peer supplies informative groups: the
#: sybil budget bounds the flood per step of the node, so a node that outpaces its only honest peer (two test
#: workers share two cores) would see the honest share fall for want of honest groups, not of the defence
#: (measured 0.36 in a loaded run with 4 prompts a step).
A_JOIN = [
    *JOIN, "--set", "sapo.external_groups=4", "--set", "sapo.max_per_peer=3", "--set", "rollout.prompts_per_step=16"
]  # fmt: skip
#: The honest peer draws 8 prompts a step, so it has informative groups to spare.
B_JOIN = [*JOIN, "--set", "rollout.prompts_per_step=8"]
SYBILS_PER_ROUND = 10


class Sybils(HivemindPeerProc):
    """The ``hivemind_peer --sybils`` process: a fresh identity for every valid record it publishes."""

    def __init__(self, tmp: Path, bootstrap: str) -> None:
        super().__init__(
            ["--swarm", "rl-swarm-demo", "--bootstrap", bootstrap, "--sybils", str(SYBILS_PER_ROUND),
             "--publish-interval", "1.0", "--duration", "600", "--out", str(tmp / "sybils.jsonl")],
            tmp / "sybils.log",
        )  # fmt: skip

    def identities(self) -> int:
        rounds = [line for line in self.lines if line.startswith("SYBILS")]
        return int(rounds[-1].split()[2]) if rounds else 0


@pytest.mark.timeout(420)
def test_an_honest_peer_keeps_half_of_the_external_data_under_a_sybil_flood(node_procs, tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = node_procs("a", "join", "--run-dir", str(a_dir), *A_JOIN)
    maddr = a.multiaddr()
    sybils = Sybils(tmp_path, maddr)
    try:
        deadline = time.monotonic() + 120
        while not sybils.identities() and time.monotonic() < deadline:
            assert sybils.proc.poll() is None, (tmp_path / "sybils.log").read_text()[-3000:]
            time.sleep(0.2)
        assert sybils.identities(), "the sybil process published nothing"
        b = node_procs("b", "join", "--peers", maddr, "--run-dir", str(b_dir), *B_JOIN)
        b.multiaddr()
        honest = Identity.load_or_create(b_dir / "identity.key").peer_id

        def since_b() -> list[dict]:
            # Counted from the honest peer's first published record: before it the flood has the swarm to itself.
            b_rows = [r for r in read_jsonl(b_dir / "metrics.jsonl") if r.get("published", 0) > 0]
            if not b_rows:
                return []
            return [r for r in read_jsonl(a_dir / "metrics.jsonl") if r["time"] >= b_rows[0]["time"]]

        def established() -> list[dict]:
            # From the first step the honest peer held more than the one newcomer slot: it is established.
            rows = since_b()
            first = next(
                (i for i, r in enumerate(rows) if (r.get("external_by_sender") or {}).get(honest, 0) > 1), None
            )
            return [] if first is None else rows[first:]

        def trained() -> tuple[int, int]:
            total = honest_n = 0
            for r in established():
                by = r.get("external_by_sender") or {}
                total += sum(by.values())
                honest_n += by.get(honest, 0)
            return honest_n, total

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            h, t = trained()
            if t >= 100 and t - h >= 5:
                break
            for p in (a, b):
                assert p.proc.poll() is None, p.tail()
            assert sybils.proc.poll() is None, (tmp_path / "sybils.log").read_text()[-3000:]
            time.sleep(1.0)
        h, t = trained()
        minted = sybils.identities()
    finally:
        sybils.stop()
    rows = since_b()
    senders = {s for r in rows for s in (r.get("external_by_sender") or {})}
    newcomer_steps = len(rows) - len(established())
    assert minted >= 100, f"only {minted} sybil identities were minted"
    assert established(), f"the honest peer never got past the newcomer slot in {len(rows)} steps"
    assert t >= 100, f"node a trained on only {t} external groups after the honest peer was established"
    assert t - h >= 5, f"the flood never reached the learner ({h} of {t} groups honest): the test would prove nothing"
    assert len(senders) >= 6, senders  # many sybil identities got through the checks and competed
    assert h / t >= 0.5, (
        f"honest share {h}/{t} = {h / t:.2f} < 0.5 under {minted} sybil identities, "
        f"after {newcomer_steps} steps as a newcomer"
    )
    a.signal(signal.SIGTERM)
    b.signal(signal.SIGTERM)
    assert a.wait(timeout=120) == 0, a.tail()
