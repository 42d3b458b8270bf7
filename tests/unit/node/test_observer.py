"""The swarm observer: re-scoring with the node's verifier, gap flags, bounded regeneration, refusals, no torch."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from node.observer.http import ObserverServer
from node.observer.state import BoundedTasks, ObserverLimits, SwarmObserver
from protocol.identity import Identity
from protocol.records import encode_record
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from protocol.validation import RecordValidator

WS = 15
NOW = 1_700_000_000.0
NOW_W = int(NOW // WS)
ALICE = Identity.from_private_bytes(b"\x01" * 32)
BOB = Identity.from_private_bytes(b"\x02" * 32)
CHAIN = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
ROOT = Path(__file__).resolve().parents[3]


class Clock:
    def __init__(self, t: float = NOW):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_observer(clock: Clock | None = None, **limits) -> SwarmObserver:
    clock = clock or Clock()
    validator = RecordValidator("s", WS, 1 << 20, 1, 4, 16, clock=clock)
    lim = ObserverLimits(**limits)
    return SwarmObserver(validator, limits=lim, tasks=BoundedTasks(lim, clock=clock), clock=clock)


def gold(index: int, config=CHAIN, family="chain_sum") -> str:
    from node.config import TaskConfig, TaskFamily
    from node.tasks import TaskSource

    src = TaskSource(TaskConfig(families=[TaskFamily(name=family, config=config)]))
    return src.materialize(TaskRef(family, config, 0, index)).answer


def record(ident: Identity, groups, seq: int, *, hint: float | None = None, swarm: str = "s") -> bytes:
    batch = RolloutBatch("builtin:tiny", 3, "tok", tuple(groups))
    return encode_record(
        ident, kind="rollouts", swarm=swarm, seq=seq, window=NOW_W, created=NOW, payload=batch, max_bytes=1 << 20
    )


def group(index: int, texts: list[str], hint: float | None, config=CHAIN, family="chain_sum") -> Group:
    return Group(TaskRef(family, config, 0, index), tuple(Completion(t, 4, reward_hint=hint) for t in texts))


def test_rescores_with_the_verifier_and_flags_a_lying_peer():
    obs = make_observer()
    right, wrong = f"<answer>{gold(1)}</answer>", "<answer>-1</answer>"
    # Alice is honest: her hints equal the verifier's rewards. Bob claims every answer is right.
    for seq in range(4):
        assert obs.feed(record(ALICE, [group(seq, [right if seq % 2 == 0 else wrong] * 4, None)], seq)) is not None
    texts = [right, right, wrong, wrong] * 2
    honest = Group(
        TaskRef("chain_sum", CHAIN, 0, 1), tuple(Completion(t, 4, reward_hint=float(t == right)) for t in texts)
    )
    assert obs.feed(record(ALICE, [honest], 10)) is not None
    for seq in range(3):
        assert obs.feed(record(BOB, [group(1, [wrong] * 4, 1.0)], seq)) is not None
    st = obs.state()
    peers = {p["peer"]: p for p in st["peers"]}
    bob = peers[BOB.peer_id]
    assert bob["verified"] == 0.0 and bob["hint"] == 1.0 and bob["gap"] is True
    alice = peers[ALICE.peer_id]
    assert alice["completions"] == 24 and alice["hint"] == 0.5 and alice["gap"] is False
    assert st["families"]["chain_sum"]["n"] == 36
    assert st["recent"][0]["peer"] == BOB.peer_id and st["recent"][0]["text"] == wrong
    assert alice["series"] and all(0.0 <= pt["verified"] <= 1.0 for pt in alice["series"])


def test_forged_replayed_and_foreign_records_are_refused_and_counted():
    obs = make_observer()
    good = record(ALICE, [group(1, ["<answer>3</answer>"], 1.0)], 1)
    assert obs.feed(good) is not None
    assert obs.feed(good) is None  # byte-identical: a duplicate, not a replay
    forged = bytearray(record(ALICE, [group(1, ["x"], 1.0)], 2))
    forged[-5] ^= 0xFF
    assert obs.feed(bytes(forged)) is None
    assert obs.feed(record(BOB, [group(1, ["x"], 1.0)], 1, swarm="other")) is None
    assert obs.feed(b"\x00garbage") is None
    st = obs.state()
    assert st["duplicates"] == 1
    v = st["refusals"]["validator"]
    assert v.get("bad_signature", 0) + v.get("malformed", 0) + v.get("non_canonical", 0) >= 2
    assert v["wrong_swarm"] == 1
    assert [p["peer"] for p in st["peers"]] == [ALICE.peer_id]
    # A flood: the node's per-window quota (16 here) applies, the excess is counted and not shown.
    for seq in range(100, 120):
        obs.feed(record(BOB, [group(1, ["<answer>3</answer>"], 1.0)], seq))
    st = obs.state()
    assert st["refusals"]["validator"]["quota"] == 4
    assert {p["peer"]: p["records"] for p in st["peers"]}[BOB.peer_id] == 16


def test_regeneration_is_bounded_and_hostile_refs_are_refusals():
    clock = Clock()
    obs = make_observer(clock, max_configs=2, new_configs_per_minute=3, max_groups_per_record=2)
    hostile = [
        group(0, ["a"], 1.0, family="no_such_family"),
        group(0, ["a"], 1.0, config={"min_terms": "lots"}),
    ]
    assert obs.feed(record(BOB, hostile, 1)) is not None
    # Distinct configs beyond the per-minute budget are refused; the budget refills after a minute.
    many = [group(0, ["a"], 0.0, config={**CHAIN, "max_digits": d}) for d in (2, 3)]
    assert obs.feed(record(BOB, many, 2)) is not None
    assert obs.feed(record(BOB, [group(0, ["a"], 0.0, config={**CHAIN, "max_digits": 4})] * 5, 3)) is not None
    st = obs.state()
    tasks = st["refusals"]["tasks"]
    assert tasks["unknown_family"] == 1 and tasks["bad_task_config"] == 1
    # Builds 1-3 (failed ones included) use the minute's budget; max_digits=3 and twice max_digits=4 are refused.
    assert tasks["task_budget"] == 3
    assert tasks["groups_unscored"] == 3  # 5 groups, 2 scored per record
    clock.t += 121  # the validator shares this clock: a record of the old window is now stale
    assert obs.feed(record(BOB, [group(0, ["a"], 0.0, config={**CHAIN, "max_digits": 4})], 4)) is None
    assert obs.state()["refusals"]["validator"]["stale"] == 1
    bad_index = [group(10**12, ["a"], 0.0)]
    bob2 = Identity.from_private_bytes(b"\x03" * 32)
    fresh = encode_record(
        bob2,
        kind="rollouts",
        swarm="s",
        seq=1,
        window=int(clock.t // WS),
        created=clock.t,
        payload=RolloutBatch("m", 0, "t", tuple(bad_index)),
        max_bytes=1 << 20,
    )
    assert obs.feed(fresh) is not None
    assert obs.state()["refusals"]["tasks"]["bad_task_index"] == 1


def test_task_sources_are_an_lru():
    obs = make_observer(max_configs=2, new_configs_per_minute=10)
    for seq, d in enumerate((2, 3, 4, 2)):
        obs.feed(record(ALICE, [group(0, ["<answer>1</answer>"], 0.0, config={**CHAIN, "max_digits": d})], seq))
    assert obs.state()["tasks_built"] == 4  # max_digits=2 was evicted by 4, then built again
    assert len(obs.tasks._sources) == 2
    assert obs.state()["peers"][0]["completions"] == 4


def test_page_and_state_endpoint_over_http():
    obs = make_observer()
    obs.feed(record(ALICE, [group(1, ["<script>alert(1)</script><answer>3</answer>"], 1.0)], 1))

    async def main():
        server = await ObserverServer.start(obs.state, "127.0.0.1", 0)
        try:

            async def get(path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
                r, w = await asyncio.open_connection("127.0.0.1", server.port)
                w.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                data = await r.read()
                w.close()
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = dict(line.split(": ", 1) for line in lines[1:])
                return lines[0], headers, body

            status, headers, body = await get("/")
            assert status == "HTTP/1.1 200 OK" and b'src="/app.js"' in body
            assert "script-src 'self'" in headers["Content-Security-Policy"]
            assert b"http://" not in body and b"https://" not in body  # nothing loaded from elsewhere
            status, _, js = await get("/app.js")
            assert status.endswith("200 OK") and b"innerHTML" not in js and b"textContent" in js
            status, headers, body = await get("/api/state?x=1")
            assert headers["Content-Type"] == "application/json"
            state = json.loads(body)
            assert state["recent"][0]["text"].startswith("<script>")
            assert (await get("/../pyproject.toml"))[0].endswith("404 Not Found")
            assert (await get("/api/state", "POST"))[0].endswith("405 Method Not Allowed")
        finally:
            await server.close()

    asyncio.run(main())


def test_the_observer_process_side_never_imports_torch():
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import node.observer.watch, node.cli.app
        from tests.unit.node.test_observer import make_observer, record, group, ALICE, gold
        obs = make_observer()
        assert obs.feed(record(ALICE, [group(1, ["<answer>" + gold(1) + "</answer>"], 1.0)], 1)) is not None
        assert obs.state()["peers"][0]["verified"] == 1.0
        bad = [m for m in ("torch", "transformers", "hivemind", "libp2p") if m in sys.modules]
        assert not bad, bad
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_watch_on_a_busy_port_is_one_clear_error_line():
    import socket

    from typer.testing import CliRunner

    from node.cli.app import app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = CliRunner().invoke(app, ["watch", "--port", str(port)])
    assert res.exit_code == 1
    assert res.output.strip().startswith("error: cannot serve the page on 127.0.0.1:") and "Traceback" not in res.output


def test_partial_credit_counts_in_the_verified_reward_but_not_as_exact():
    """A chain_sum answer of the right digits with the wrong sign earns reasoning-gym partial credit; the page's
    exact column (solve_rate) counts only answers equal to the gold answer."""
    obs = make_observer()
    index = next(i for i in range(50) if gold(i).lstrip("-") not in ("", "0") and not gold(i).startswith("-"))
    near = f"<answer>-{gold(index)}</answer>"  # the right digits, the wrong sign
    right = f"<answer>{gold(index)}</answer>"
    assert obs.feed(record(ALICE, [group(index, [near, near, near, right], None)], 1)) is not None
    [alice] = obs.state()["peers"]
    assert alice["solve_rate"] == 0.25
    assert alice["verified"] > 0.25  # the near misses earned partial credit
