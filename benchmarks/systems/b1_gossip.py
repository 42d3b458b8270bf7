"""B1 gossip: how fast signed rollout records spread over the real hivemind transport, against raw hivemind.

N peer processes on 127.0.0.1 each publish one group record per step (64 completions built from
``protocol.types`` values, signed with ``encode_record``, ~50-200 KB) and poll the recent windows. Per record
we time how long until every other peer has it (p50, p95), plus records/s, wire bytes per completion and the
share of encode+sign+validate+decode in the time spent (client side and inside the DHT's store guard).

Baseline in the same run: ``raw`` = the same transport and key layout (content-addressed record keys, signed
per-sender index entries under peer and shard keys, bounded sampled reads; ``protocol/layout.py``) without the
DHT's store-time guard and without decoding or validating what arrives. The figures that matter are the ratios
(transport / raw) and the median over ``--repeats``. With sampled reads a poll fetches at most a few records, so
"full visibility" takes several polls once peers publish faster than one poll drains.

Usage::

    python benchmarks/systems/b1_gossip.py                  # 8 and 32 peers, writes benchmarks/results/b1_gossip.md
    python benchmarks/systems/b1_gossip.py --peers 8 --repeats 3
    python benchmarks/systems/b1_gossip.py --quick --out /tmp/b1   # 3 small peers, one repeat (what the test runs)
    python benchmarks/systems/b1_gossip.py --peers 64 --repeats 1 --modes hivemind --poll-s 2.0 --launch fork
                                                    # 64 peers forked from one process (shared import pages)

Knows nothing about training: records carry synthetic text of realistic size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems import gossip as b1_common  # noqa: E402
from benchmarks.systems import gossip_summary as b1_summary  # noqa: E402
from benchmarks.systems import launch  # noqa: E402
from benchmarks.systems.gossip import SWARM, make_batch  # noqa: E402

# -- worker (one peer per process) --------------------------------------------------------------------------

# what a worker imports: the zygote of ``--launch fork`` imports it once for every peer
PROTOCOL = ("identity", "layout", "records", "transport.config", "transport.hivemind.transport", "validation")
PRELOAD = ("hivemind", *(f"protocol.{m}" for m in PROTOCOL))


def run_worker(wargs: dict) -> None:
    asyncio.run(worker(wargs))


async def worker(args: dict) -> None:
    from protocol.identity import Identity
    from protocol.layout import encode_index_entry, record_digest_hex
    from protocol.records import encode_record, window_of
    from protocol.transport.config import HivemindTransportConfig, ProtocolConfig
    from protocol.transport.hivemind.transport import HivemindTransport
    from protocol.validation import RecordValidator

    mode, boot, n_expected = args["mode"], args.get("bootstrap"), args["peers"] * args["steps"]
    # the read budget of one poll (SPEC 7.4): the transport's defaults unless the command line sets them
    budget = {k: args[k] for k in ("poll_senders", "poll_records") if args.get(k)}
    pc = ProtocolConfig(window_seconds=args["window_seconds"], max_past_windows=8, fetch_past_windows=2, **budget)
    validator = RecordValidator.from_config(SWARM, pc)
    ident = Identity.generate()
    rng = random.Random(args["index"])
    # wall seconds per part, and the CPU seconds of the codec parts (their own thread's CPU: on shared cores a
    # wall clock also counts the time another thread or process held the core)
    timing = {
        "encode": 0.0,
        "check": 0.0,
        "publish": 0.0,
        "fetch": 0.0,
        "polls": 0,
        "encode_cpu": 0.0,
        "check_cpu": 0.0,
    }
    seen, published, sizes = b1_common.peer_logs()
    own: dict[int, list[str]] = {}  # this peer's digests per window: its signed index entry lists them

    beam = {"lookup_beam": args["lookup_beam"]} if args.get("lookup_beam") else {}
    cfg = HivemindTransportConfig(initial_peers=[boot] if boot else [], request_timeout_s=20, **beam)
    guard = validator.verdict if mode == "hivemind" else None
    transport = await HivemindTransport.create(cfg, swarm=SWARM, validate=guard, protocol=pc)
    addr = transport.addresses()[0]
    print("READY", addr, flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line.startswith("GO"):  # the coordinator went away before the start: leave cleanly
        await transport.close()
        return
    t0 = float(line.split()[1])
    end = t0 + args["steps"] * args["interval"] + args["settle_s"]

    async def publisher() -> None:
        for step in range(args["steps"]):
            await asyncio.sleep(max(0.0, t0 + step * args["interval"] - time.time()))
            batch = make_batch(args["record_kb"], step, rng)
            start, cpu = time.time(), time.thread_time()
            window = window_of(start, pc.window_seconds)
            seq = step + 1
            data = encode_record(
                ident, kind="rollouts", swarm=SWARM, seq=seq, window=window, created=start, payload=batch
            )
            t1 = time.time()
            timing["encode"] += t1 - start
            timing["encode_cpu"] += time.thread_time() - cpu
            digest = record_digest_hex(data)
            published[digest] = start
            sizes.append(len(data))
            own.setdefault(window, []).append(digest)
            index = encode_index_entry(ident, SWARM, window, own[window])
            await transport.publish(data, window=window, sender=ident.peer_id, index=index)
            timing["publish"] += time.time() - t1

    async def poller() -> None:
        while time.time() < end and (len(seen) < n_expected or len(published) < args["steps"]):
            datas, now = await b1_common.fetch_timed(transport, pc.window_seconds, timing, tolerate=True)
            for data in datas:
                rid = record_digest_hex(data)
                if rid in seen:
                    continue
                if mode == "hivemind":
                    t2, cpu = time.time(), time.thread_time()
                    env = validator.check(data)
                    timing["check"] += time.time() - t2
                    timing["check_cpu"] += time.thread_time() - cpu
                    if env is None:
                        continue
                seen[rid] = now
            await asyncio.sleep(args["poll_s"])

    try:
        await asyncio.gather(publisher(), poller())
        stats = transport.stats() if mode == "hivemind" else {}
        guard_s, guard_cpu = stats.get("guard_seconds", 0.0), stats.get("guard_cpu_seconds", 0.0)
        out = {
            "published": published,
            "seen": seen,
            "sizes": sizes,
            "timing": {**timing, "guard": guard_s, "guard_cpu": guard_cpu},
            "rss_bytes": launch.rss_tree_bytes(),
            "pss_bytes": launch.pss_tree_bytes(),
        }
    finally:  # stop p2pd even when this peer fails (a forked peer leaves by os._exit, with no interpreter cleanup)
        await transport.close()
    Path(args["outfile"]).write_text(json.dumps(out))


# -- coordinator ----------------------------------------------------------------------------------------------


def summarize(mode: str, peers: int, results: list[dict]) -> dict:
    # The DHT's store guard runs inside the storing peers' publish and fetch calls, already in their time.
    return b1_summary.summarize(
        mode, peers, results, transport="hivemind", guard_in_total=False, require_all_peers=False
    )


def run_one(mode: str, peers: int, opts: argparse.Namespace, workdir: Path) -> dict:
    return summarize(mode, peers, b1_common.run_swarm(__file__, mode, peers, opts, workdir))


def render(rows: list[dict], machine: str, opts: argparse.Namespace) -> str:
    from protocol.transport.config import HivemindTransportConfig, ProtocolConfig  # (no hivemind import)

    description = (
        f"Each peer publishes one signed group record (64 completions, ~{opts.record_kb:.0f} KB) every "
        f"{opts.interval:g} s (0: 5 + peers/2) for {opts.steps} steps and polls every {opts.poll_s:g} s. "
        f"Visibility = time from "
        f"the publisher's encode call until the last other peer has the record (incomplete records count as inf). "
        f"Median of {opts.repeats} repeat(s). raw = the same transport and key layout (signed per-sender index "
        f"entries, sampled bounded reads) without the store-time guard and without receive-side validation. "
        f"codec share = (encode+sign + receive validate+decode + DHT store "
        f"guard) / (encode + publish + fetch + receive checks). A poll reads at most "
        f"{opts.poll_senders or ProtocolConfig().poll_senders} index entries and fetches at most "
        f"{opts.poll_records or ProtocolConfig().poll_records} records (`--poll-senders`, `--poll-records`); a DHT "
        f"lookup visits {opts.lookup_beam or HivemindTransportConfig().lookup_beam} nodes (`--lookup-beam`)."
        + launch.launch_note(opts)
    )
    return b1_summary.render("hivemind", machine, description, rows)


def main(argv: list[str] | None = None) -> int:
    ap = b1_common.parser(__doc__, poll_s=0.25, modes="raw,hivemind")
    ap.add_argument("--poll-senders", type=int, help="index entries one poll reads (default the protocol's, 12)")
    ap.add_argument("--poll-records", type=int, help="records one poll fetches (default the protocol's, 10)")
    ap.add_argument("--lookup-beam", type=int, help="nodes one DHT lookup visits (default the transport's, 8)")
    opts = ap.parse_args(argv)
    if launch.worker_main(opts, PRELOAD, run_worker):
        return 0
    b1_common.apply_quick(opts)
    # Turn SIGTERM into SystemExit so run_swarm's cleanup stops every worker by pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    machine = b1_summary.machine_line("hivemind")
    rows = []
    for peers, per_mode in b1_common.sweep(opts, run_one, tmp_prefix="b1_"):
        group = [b1_summary.median_row(mode, peers, runs) for mode, runs in per_mode.items()]
        b1_summary.add_ratios(group, finite_raw_only=False)
        rows += group
    b1_summary.write(render(rows, machine, opts), opts.out, "b1_gossip.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
