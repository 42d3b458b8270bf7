"""Volunteers behind home routers, measured in network namespaces (``sim.netlab``; root, iproute2, nftables).

Scenarios (bare transport peers, ``tests.integration.hivemind_peer``, each publishing small signed records and
polling; all hosts listen on 0.0.0.0, nobody is told whether it is behind NAT unless the mode says so):

* ``nat``     -- share of (record, reader) pairs delivered: the same swarm on one segment, behind NAT routers with
  ``client_mode: auto`` (the default), and behind NAT with every node a DHT server (the old default);
* ``latency`` -- B1-style visibility (publish -> each reader) at 8 peers on links of 0, 100 ms RTT / 1% loss and
  300 ms RTT / 5% loss;
* ``drop``    -- recovery times: a peer's link down ``--cut-s`` mid-run; the bootstrap host's namespace removed; a peer
  started while its only ``--peers`` address is down (that host's link comes up ``--cut-s`` later).

With real ``swarm-node join`` processes: ``train`` (4 nodes, no delay vs 100 ms RTT / 1%), ``train-drop`` (a node's
link cut ``--cut-s`` mid-run), ``nat-join`` (the ``nat`` swarm as real nodes: which senders' groups each node trained
on). ``libp2p-nat``: py-libp2p peers (``tests/libp2p_isolated/peer_lp2p.py``) on one segment and behind NAT.

Usage::

    python benchmarks/systems/netlab.py nat latency drop --out benchmarks/results/netlab.md

Knows nothing about training: records carry synthetic text.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems.netlab_join import (  # noqa: E402
    chosen,
    scenario_libp2p_nat,
    scenario_nat_join,
    scenario_train,
    scenario_train_drop,
)
from sim.netlab.lab import Lab  # noqa: E402
from sim.netlab.swarm import Peer, delivery, start_peer, wait_published  # noqa: E402
from sim.netlab.topology import parse  # noqa: E402


def run_swarm(
    topo: str, mode: str, records: int, interval: float, settle_s: float, workdir: Path, home_args: tuple = ()
) -> dict:
    """Every host runs a peer (the first public one bootstraps the rest); each publishes ``records`` records every
    ``interval`` s; polling goes on ``settle_s`` after the last. Delivery over all pairs and per reader kind."""
    workdir.mkdir(parents=True, exist_ok=True)
    common = ["--mode", mode, "--records", str(records), "--publish-interval", str(interval), "--poll-s", "1"]
    common += ["--record-kb", "8", "--duration", str(records * interval + settle_s + 60), "--start-delay", "5"]
    t0 = time.monotonic()
    with Lab(parse(topo)) as lab:
        hosts = list(lab.hosts)
        first = start_peer(lab, hosts[0], workdir, common)
        boot = first.wait_addr()
        peers = [first] + [
            start_peer(lab, h, workdir, [*common, "--bootstrap", boot, *(home_args if lab.hosts[h].natted else ())])
            for h in hosts[1:]
        ]
        for p in peers:
            p.wait_addr()
        wait_published(peers, records, records * interval + 120)
        time.sleep(settle_s)
        natted = {h for h, info in lab.hosts.items() if info.natted}
        out = {
            "topology": topo,
            "mode": mode,
            "all": delivery(peers),
            "nat_to_nat": _subset(peers, natted),
            "modes": {p.host: (p.stats().get("client_mode"), p.stats().get("reachable")) for p in peers},
            "wall_s": round(time.monotonic() - t0, 1),
        }
    return out


def _subset(peers: list[Peer], hosts: set[str]) -> dict:
    """Delivery counted over the pairs whose publisher and reader are both among ``hosts``."""
    sub = [p for p in peers if p.host in hosts]
    return delivery(sub) if len(sub) > 1 else {}


def fmt(d: dict) -> str:
    if not d:
        return "-"
    return f"{d['share']:.3f} ({d['delivered']}/{d['pairs']})"


def scenario_nat(opts: argparse.Namespace, work: Path) -> str:
    n_home = sum(int(x) for x in opts.homes.split(","))
    rows = [
        (f"public={opts.public + n_home}", "auto", "one segment"),
        (f"public={opts.public} homes={opts.homes} nat=symmetric", "auto", "NAT, client_mode auto (default)"),
        (f"public={opts.public} homes={opts.homes} nat=symmetric", "server", "NAT, every node a DHT server (old)"),
        (f"public={opts.public} homes={opts.homes} nat=cone", "auto", "NAT (cone), client_mode auto"),
        (f"public={opts.public} homes={opts.homes} nat=symmetric", "server+relay", "NAT, servers, relay_via_peers"),
    ]
    lines = [
        "| swarm | topology | mode | delivered (all pairs) | NATed -> NATed | p50 s | p95 s | DHT clients | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (topo, mode, label) in chosen(rows, opts.nat_rows):
        relay = mode == "server+relay"
        mode = "server" if relay else mode
        home_args = ("--relay",) if relay else ()
        r = run_swarm(topo, mode, opts.records, opts.interval, opts.settle_s, work / f"nat{i}", home_args)
        print(json.dumps(r), file=sys.stderr, flush=True)
        a = r["all"]
        lines.append(
            f"| {label} | `{topo}` | {mode}{' + relay' if relay else ''} | {fmt(a)} | {fmt(r['nat_to_nat'])} | "
            f"{a['p50_s']:.2f} | {a['p95_s']:.2f} | {sum(1 for c, _ in r['modes'].values() if c == 1.0)} of "
            f"{len(r['modes'])} | {r['wall_s']} |"
        )
    return "\n".join(lines)


def scenario_latency(opts: argparse.Namespace, work: Path) -> str:
    rows = [("public=8", "no delay (namespaces, veth)"), ("public=8 link=25ms/0ms/1%", "100 ms RTT, 1% loss")]
    rows.append(("public=8 link=75ms/0ms/5%", "300 ms RTT, 5% loss"))
    lines = ["| link | topology | delivered | p50 s | p95 s | wall s |", "|---|---|---|---|---|---|"]
    for i, (topo, label) in enumerate(rows):
        r = run_swarm(topo, "auto", opts.records, opts.interval, opts.settle_s, work / f"lat{i}")
        print(json.dumps(r), file=sys.stderr, flush=True)
        a = r["all"]
        lines.append(f"| {label} | `{topo}` | {fmt(a)} | {a['p50_s']:.2f} | {a['p95_s']:.2f} | {r['wall_s']} |")
    return "\n".join(lines)


def _first_after(reader: Peer, sender: Peer, t: float) -> float:
    """Seconds from ``t`` until ``reader`` received a record of ``sender`` published after ``t`` (inf if never)."""
    after = {s for s, pt in sender.published.items() if pt >= t}
    ts = [r["t"] for r in reader.received() if r["sender"] == sender.peer_id and r["seq"] in after]
    return min(ts) - t if ts else float("inf")


def _trio(lab: Lab, w: Path, common: list[str]) -> tuple[Peer, Peer, Peer]:
    """Peers on pub0, pub1 and pub2 (pub0 bootstraps the others), returned once all three have run 15 s."""
    a = start_peer(lab, "pub0", w, common)
    boot = a.wait_addr()
    b, c = (start_peer(lab, h, w, [*common, "--bootstrap", boot]) for h in ("pub1", "pub2"))
    b.wait_addr(), c.wait_addr()
    time.sleep(15)
    return a, b, c


def scenario_drop(opts: argparse.Namespace, work: Path) -> str:
    n, cut = 40 + int(opts.cut_s), opts.cut_s
    common = ["--mode", "auto", "--records", str(n), "--publish-interval", "1", "--poll-s", "1"]
    common += ["--record-kb", "8", "--duration", str(n + 90)]
    lines = ["| fault | recovery | detail |", "|---|---|---|"]
    w1, w2, w3 = (work / f"drop{k}" for k in (1, 2, 3))
    for w in (w1, w2, w3):
        w.mkdir(parents=True)
    # 1. a peer's link down for cut s
    with Lab(parse("public=3")) as lab:
        a, b, c = _trio(lab, w1, common)
        lab.link_down("pub2")
        time.sleep(cut)
        alive = c.proc.poll() is None
        published_alone = sum(1 for t in c.published.values() if t > time.time() - cut)
        lab.link_up("pub2")
        back = time.time()
        time.sleep(40)
        seen_again = max(_first_after(a, c, back), _first_after(b, c, back))
        reads_again = max(_first_after(c, a, back), _first_after(c, b, back))
        lines.append(
            f"| pub2's link down {cut:g} s, then up | peers read pub2 again after {seen_again:.1f} s; pub2 reads "
            f"them after {reads_again:.1f} s | pub2 alive through the cut: {alive}; records it published while cut "
            f"off: {published_alone} |"
        )
    # 2. the bootstrap host disappears
    with Lab(parse("public=3")) as lab:
        a, b, c = _trio(lab, w2, common)
        lab.remove_host("pub0")
        gone = time.time()
        time.sleep(40)
        after = delivery([b, c], since=gone + 5)
        lines.append(
            f"| bootstrap host pub0's namespace removed | pub1 <-> pub2 after removal: {fmt(after)} delivered; "
            f"first record {max(_first_after(b, c, gone), _first_after(c, b, gone)):.1f} s after | "
            f"records published from removal +5 s on |"
        )
    # 3. a peer starts while its only --peers address is down
    with Lab(parse("public=2")) as lab:
        a = start_peer(lab, "pub0", w3, common)
        boot = a.wait_addr()
        lab.link_down("pub0")
        b = start_peer(lab, "pub1", w3, [*common, "--bootstrap", boot])
        b.wait_addr()
        time.sleep(cut)
        alive = b.proc.poll() is None
        lab.link_up("pub0")
        up = time.time()
        time.sleep(45)
        joined = max(_first_after(a, b, up), _first_after(b, a, up))
        said = [x for x in b.log.read_text().splitlines() if "none of the" in x]
        lines.append(
            f"| pub1 starts while its only --peers address (pub0) is down; pub0 comes up {cut:g} s later | both "
            f"read each other {joined:.1f} s after | pub1 alive meanwhile: {alive}; its line: "
            f"`{said[0].split(': ', 1)[-1] if said else 'none'}` |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    scenarios = ["nat", "latency", "drop", "train", "train-drop", "nat-join", "libp2p-nat"]
    ap.add_argument("scenarios", nargs="+", choices=scenarios)
    ap.add_argument("--train-steps", type=int, default=150)
    ap.add_argument("--public", type=int, default=2)
    ap.add_argument("--homes", default="3,3,2")
    ap.add_argument("--records", type=int, default=4)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--settle-s", type=float, default=30.0)
    ap.add_argument("--cut-s", type=float, default=60.0)
    ap.add_argument("--nat-rows", default="", help="nat scenario: comma-separated row numbers to run (default all)")
    ap.add_argument("--out", type=Path, help="write the tables here (markdown) as well as to stdout")
    opts = ap.parse_args()
    parts = []
    with tempfile.TemporaryDirectory(prefix="netlab-") as tmp:
        for s in opts.scenarios:
            t0 = time.monotonic()
            run = {
                "nat": scenario_nat,
                "latency": scenario_latency,
                "drop": scenario_drop,
                "train": scenario_train,
                "train-drop": scenario_train_drop,
                "nat-join": scenario_nat_join,
                "libp2p-nat": scenario_libp2p_nat,
            }[s]
            table = run(opts, Path(tmp))
            parts.append(f"## {s} ({time.monotonic() - t0:.0f} s)\n\n{table}\n")
            print(parts[-1], flush=True)
    if opts.out:
        opts.out.write_text("\n".join(parts))


if __name__ == "__main__":
    main()
