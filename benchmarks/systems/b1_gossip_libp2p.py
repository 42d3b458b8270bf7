"""B1 gossip over libp2p: how fast signed rollout records spread over the py-libp2p transport, against raw GossipSub.

Same workload and table as ``benchmarks/systems/b1_gossip.py`` (the hivemind run): N peer processes on 127.0.0.1 each
publish one group record per step (64 completions, ``encode_record``, ~50-200 KB) and poll the recent windows.
Per record we time how long until every other peer has it (p50, p95), plus records/s, wire bytes per completion
and the share of encode+sign+validate+decode in the time spent (client side and the transport's edge validator).

Baseline in the same run: raw py-libp2p GossipSub (same router settings) carrying the same bytes, no validation,
no decoding, no sync protocol, no peer exchange; arrival is when the subscription yields the message.

Every peer bootstraps from peer 0's address. Mode ``libp2p-leave``: the same, but peer 0 publishes a third of the
steps and then leaves the swarm while the others go on (every record must still reach every peer that stayed).
For both transport modes the results also show the connection graph at the end: mean degree, the fewest
connections a peer has besides the bootstrap node (0 would be a star), and the components without it.

Every process here imports libp2p and never hivemind (they cannot share a process).

Usage::

    python benchmarks/systems/b1_gossip_libp2p.py          # 8 and 32 peers -> benchmarks/results/b1_gossip_libp2p.md
    python benchmarks/systems/b1_gossip_libp2p.py --peers 8 --repeats 1 --modes libp2p,libp2p-leave
    python benchmarks/systems/b1_gossip_libp2p.py --quick --out /tmp/b1  # 3 small peers, one repeat (the test)

Knows nothing about training: records carry synthetic text of realistic size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems import gossip as b1_common  # noqa: E402
from benchmarks.systems import gossip_summary as b1_summary  # noqa: E402  (imports neither hivemind nor libp2p)
from benchmarks.systems import launch, libp2p_peer  # noqa: E402

# -- worker (one peer per process) --------------------------------------------------------------------------


# what a worker imports: the zygote of ``--launch fork`` imports it once for every peer
PROTOCOL = ("identity", "records", "transport.config", "transport.libp2p.transport", "validation")
PRELOAD = ("trio", "multiaddr", "libp2p", *(f"protocol.{m}" for m in PROTOCOL))


def run_worker(wargs: dict) -> None:
    if wargs["mode"] == "raw":
        libp2p_peer.raw_worker(wargs)
    else:
        asyncio.run(libp2p_peer.worker(wargs))


# -- coordinator ----------------------------------------------------------------------------------------------


# How records arrived at a peer: inline in a gossip message, fetched after an announcement (or from another forwarder
# after that fetch failed), pulled by sync; and the copies of announcements dropped unjudged without a fetch: their
# record was already being fetched, or their forwarder had 2 fetches running or was held off after a failed one.
ARRIVAL_STATS = (
    "gossip_records",
    "fetched_large",
    "fetched_large_retry",
    "synced",
    "announce_copy_in_flight",
    "announce_forwarder_busy",
    "announce_forwarder_held_off",
)


def summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by reason, added up (reasons that stay at zero are left out)."""
    return dict(sum((Counter(c) for c in counts), Counter()))


def summarize(mode: str, peers: int, results: list[dict]) -> dict:
    # The edge validator runs in the router, outside publish and fetch: it counts in the time spent too.
    row = b1_summary.summarize(mode, peers, results, transport="libp2p", guard_in_total=True, require_all_peers=True)
    row["drops"] = summed(r.get("drops", {}) for r in results)
    row["rejected"] = summed(r.get("stats", {}).get("rejected", {}) for r in results)
    row["arrivals"] = summed({k: r.get("stats", {}).get(k, 0) for k in ARRIVAL_STATS} for r in results)
    row["mesh"] = mesh_summary(results) if mode != "raw" else None
    return row


def mesh_summary(results: list[dict]) -> dict:
    """The connection graph at the end of a run: mean degree, the smallest number of connections a peer has to
    peers other than the bootstrap node (0 = it hangs off the bootstrap node alone: a star), and the connected
    components of the graph without the bootstrap node (1 = the swarm survives the bootstrap node leaving)."""
    boot = next((r["peer_id"] for r in results if r.get("index", 0) == 0 and r.get("peer_id")), None)
    ids = {r["peer_id"] for r in results if r.get("peer_id")} - {boot}
    edges: dict[str, set[str]] = {p: set() for p in ids}
    degrees = []
    for r in results:
        if r.get("peer_id") in ids:
            conns = set(r.get("connections", [])) & ids
            degrees.append(len(r.get("connections", [])))
            for q in conns:
                edges[r["peer_id"]].add(q)
                edges[q].add(r["peer_id"])
    seen: set[str] = set()
    components = 0
    for start in ids:
        if start in seen:
            continue
        components += 1
        stack = [start]
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack += list(edges[p] - seen)
    return {
        "mean_degree": statistics.mean(degrees) if degrees else 0.0,
        "min_degree_without_boot": min((len(e) for e in edges.values()), default=0),
        "components_without_boot": components,
    }


def run_one(mode: str, peers: int, opts: argparse.Namespace, workdir: Path) -> dict:
    # ``libp2p-leave``: the bootstrap node (peer 0) publishes about a third of the steps, then leaves.
    leave = max(1, opts.steps // 3) if mode == "libp2p-leave" else 0
    run_opts = argparse.Namespace(**{**vars(opts), "boot_leaves_after": leave})
    # A couple of heartbeats before GO: meshes form before the first publish.
    return summarize(mode, peers, b1_common.run_swarm(__file__, mode, peers, run_opts, workdir, mesh_wait_s=2.0))


def render(rows: list[dict], machine: str, opts: argparse.Namespace) -> str:
    every = f"{opts.interval:g} s" if opts.interval else "5 + peers/2 s"
    description = (
        f"Each peer publishes one signed group record (64 completions, ~{opts.record_kb:.0f} KB) every "
        f"{every} for {opts.steps} steps and polls every {opts.poll_s:g} s (a local read: records are "
        f"pushed). Visibility = time from the publisher's encode call until the last other peer has the record "
        f"(incomplete records count as inf). Median of {opts.repeats} repeat(s). raw = bare py-libp2p GossipSub "
        f"with the same router settings carrying the same bytes, no validation, decoding or sync. codec share = "
        f"(encode+sign + receive validate+decode + edge validator) / (encode + publish + fetch + receive checks "
        f"+ edge validator). Peer discovery: {opts.discovery}. Records over "
        f"{opts.inline_max_bytes or 900_000:,} bytes are announced and fetched, smaller ones travel in the gossip "
        f"message. Compare with the hivemind transport in `b1_gossip.md`." + launch.launch_note(opts)
    )
    drops = summed(r.get("drops", {}) for r in rows)
    refused = summed(r.get("rejected", {}) for r in rows)
    notes = ["", f"Drops counted by the transport (all runs): {json.dumps(drops) if drops else 'none'}."]
    notes += ["", f"Refused at the edge, by reason (all runs): {json.dumps(refused) if refused else 'none'}."]
    for r in rows:
        if any(r.get("arrivals", {}).values()):
            notes += [
                "",
                f"How records arrived, and announcements dropped without a fetch, {r['peers']} peers, {r['mode']} "
                f"(all repeats): {json.dumps(r['arrivals'])}.",
            ]
    notes += [
        "",
        "Mesh at the end of each run (median over repeats): mean connections per peer; the fewest connections a peer "
        "has to peers other than the bootstrap node (0 = a star); connected components without the bootstrap node "
        "(1 = not partitioned when it leaves). `libp2p-leave`: the bootstrap node publishes a third of the steps, "
        "then leaves while the others go on; its records count, it does not count as a receiver.",
        "",
        "| peers | mode | mean degree | min degree without bootstrap | components without bootstrap |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.get("mesh")
        if m:
            notes.append(
                f"| {r['peers']} | {r['mode']} | {m['mean_degree']:.1f} | {m['min_degree_without_boot']} "
                f"| {m['components_without_boot']} |"
            )
    return b1_summary.render("libp2p", machine, description, rows, notes)


def main(argv: list[str] | None = None) -> int:
    ap = b1_common.parser(__doc__, poll_s=0.05, modes="raw,libp2p,libp2p-leave")
    ap.add_argument(
        "--discovery",
        choices=["exchange", "gossipsub-px", "none"],
        default="exchange",
        help="how peers find each other: the transport's signed peer exchange (default), GossipSub v1.1 PX on "
        "PRUNE instead, or nothing (a star around the bootstrap node)",
    )
    ap.add_argument(
        "--inline-max-bytes",
        type=int,
        help="records up to this size travel inside the gossip message, larger ones are announced and fetched "
        "(the transport's inline_max_bytes; default its own, 900,000)",
    )
    opts = ap.parse_args(argv)
    if launch.worker_main(opts, PRELOAD, run_worker):
        return 0
    logging_setup()
    b1_common.apply_quick(opts)
    machine = b1_summary.machine_line("libp2p")
    rows = []
    for peers, per_mode in b1_common.sweep(opts, run_one, tmp_prefix="b1p2p_"):
        group = []
        for mode, runs in per_mode.items():
            row = b1_summary.median_row(mode, peers, runs)
            for key in ("drops", "rejected", "arrivals"):  # summed over the repeats
                row[key] = summed(r.get(key, {}) for r in runs)
            meshes = [r["mesh"] for r in runs if r.get("mesh")]
            if meshes:
                row["mesh"] = {k: statistics.median(m[k] for m in meshes) for k in meshes[0]}
            group.append(row)
        b1_summary.add_ratios(group, finite_raw_only=True)
        rows += group
    b1_summary.write(render(rows, machine, opts), opts.out, "b1_gossip_libp2p.md")
    return 0


def logging_setup() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
