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
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.netlab.lab import Lab  # noqa: E402
from sim.netlab.swarm import Peer, delivery, start_join, start_peer, wait_published  # noqa: E402
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
    for i, (topo, mode, label) in enumerate(rows):
        if opts.nat_rows and str(i) not in opts.nat_rows.split(","):
            continue
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


def scenario_drop(opts: argparse.Namespace, work: Path) -> str:
    n, cut = 40 + int(opts.cut_s), opts.cut_s
    common = ["--mode", "auto", "--records", str(n), "--publish-interval", "1", "--poll-s", "1"]
    common += ["--record-kb", "8", "--duration", str(n + 90)]
    lines = ["| fault | recovery | detail |", "|---|---|---|"]
    # 1. a peer's link down for cut s
    w = work / "drop1"
    w.mkdir(parents=True)
    with Lab(parse("public=3")) as lab:
        a = start_peer(lab, "pub0", w, common)
        boot = a.wait_addr()
        b, c = (start_peer(lab, h, w, [*common, "--bootstrap", boot]) for h in ("pub1", "pub2"))
        b.wait_addr(), c.wait_addr()
        time.sleep(15)
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
    w = work / "drop2"
    w.mkdir(parents=True)
    with Lab(parse("public=3")) as lab:
        a = start_peer(lab, "pub0", w, common)
        boot = a.wait_addr()
        b, c = (start_peer(lab, h, w, [*common, "--bootstrap", boot]) for h in ("pub1", "pub2"))
        b.wait_addr(), c.wait_addr()
        time.sleep(15)
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
    w = work / "drop3"
    w.mkdir(parents=True)
    with Lab(parse("public=2")) as lab:
        a = start_peer(lab, "pub0", w, common)
        boot = a.wait_addr()
        lab.link_down("pub0")
        b = start_peer(lab, "pub1", w, [*common, "--bootstrap", boot])
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


def _join_all(lab: Lab, work: Path, steps: int, extra: tuple[str, ...], *, barrier_s: int, timeout_s: float,
              poll_s: float) -> list:  # fmt: skip
    """Real ``swarm-node join`` nodes on every host of ``lab`` (the first bootstraps the rest, behind a start
    barrier of 2 peers for at most ``barrier_s``), waited on until all exit or ``timeout_s`` passes."""
    barrier = ("--set", "runtime.wait_for_peers=2", "--set", f"runtime.wait_for_peers_s={barrier_s}")
    hosts = list(lab.hosts)
    first = start_join(lab, hosts[0], work / hosts[0], steps, [], (*barrier, *extra))
    boot = first.wait_addr()
    nodes = [first] + [start_join(lab, h, work / h, steps, [boot], (*barrier, *extra)) for h in hosts[1:]]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(n.proc.poll() is None for n in nodes):
        time.sleep(poll_s)
    return nodes


def _train(topo: str, steps: int, work: Path, extra: tuple[str, ...] = ()) -> dict:
    """4 (or as many hosts as ``topo`` has) real nodes train ``steps`` steps, with a start barrier."""
    t0 = time.monotonic()
    with Lab(parse(topo)) as lab:
        nodes = _join_all(lab, work, steps, extra, barrier_s=180, timeout_s=900, poll_s=2)
        codes = [n.proc.poll() for n in nodes]
        ms = [n.metrics() for n in nodes]
    per_step = [(m[-1]["time"] - m[0]["time"]) / max(1, len(m) - 1) for m in ms if len(m) > 1]
    return {
        "topology": topo,
        "exit": codes,
        "steps": [len(m) for m in ms],
        "s_per_step": statistics.median(per_step) if per_step else float("nan"),
        "received": [m[-1].get("received", 0) if m else 0 for m in ms],
        "accepted_groups": [m[-1].get("accepted_groups", 0) if m else 0 for m in ms],
        "peers_max": [max((x.get("peers", 0) for x in m), default=0) for m in ms],
        "wall_s": round(time.monotonic() - t0, 1),
    }


def scenario_train(opts: argparse.Namespace, work: Path) -> str:
    lines = [
        "| link | topology | exit codes | steps | s/step (median) | records received per node | external groups "
        "accepted per node | most peers seen | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (topo, label) in enumerate((("public=4", "no delay"), ("public=4 link=25ms/0ms/1%", "100 ms RTT, 1%"))):
        r = _train(topo, opts.train_steps, work / f"train{i}")
        print(json.dumps(r), file=sys.stderr, flush=True)
        lines.append(
            f"| {label} | `{topo}` | {r['exit']} | {r['steps']} | {r['s_per_step']:.2f} | {r['received']} | "
            f"{r['accepted_groups']} | {r['peers_max']} | {r['wall_s']} |"
        )
    return "\n".join(lines)


def scenario_train_drop(opts: argparse.Namespace, work: Path) -> str:
    """Three real nodes; pub2's link goes down ``--cut-s`` mid-run: it keeps training, loses nothing, is read again."""
    steps, cut = 1_000_000, opts.cut_s  # stopped by SIGTERM once measured (a node checkpoints and exits 0)
    extra = ("--set", "sapo.max_age_steps=3", "--set", "runtime.wait_for_peers=2")
    with Lab(parse("public=3")) as lab:
        a = start_join(lab, "pub0", work / "tdrop" / "pub0", steps, [], extra)
        boot = a.wait_addr()
        nodes = [a] + [start_join(lab, h, work / "tdrop" / h, steps, [boot], extra) for h in ("pub1", "pub2")]
        c = nodes[2]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and len(c.metrics()) < 8:
            time.sleep(1)
        lab.link_down("pub2")
        down = time.time()
        time.sleep(cut)
        lab.link_up("pub2")
        up = time.time()
        time.sleep(60)
        for n in nodes:
            n.proc.terminate()
        for n in nodes:
            n.proc.wait(90)
        codes = [n.proc.poll() for n in nodes]
        ms = [n.metrics() for n in nodes]
    mc = ms[2]
    during = [x for x in mc if down <= x["time"] < up]
    contiguous = [x["step"] for x in mc] == list(range(1, len(mc) + 1))
    # pub2 reads again: its first step after the link came back with records received beyond its count at the cut
    recv_at_up = max((x.get("received", 0) for x in mc if x["time"] < up), default=0)
    reads_again = next((x["time"] - up for x in mc if x["time"] >= up and x.get("received", 0) > recv_at_up), None)
    # peers read pub2 again: the first step after the link came back where each other node counts 2 peers
    seen_again = []
    for m in ms[:2]:
        t = next((x["time"] - up for x in m if x["time"] >= up and x.get("peers", 0) >= 2), None)
        seen_again.append(t)
    low = [min((x.get("peers", 0) for x in m if down + 10 <= x["time"] < up), default=None) for m in ms[:2]]
    fmt_t = lambda t: "never" if t is None else f"{t:.1f} s"  # noqa: E731
    return "\n".join(
        [
            "| what | measured |",
            "|---|---|",
            f"| pub2 trained while cut off ({cut:g} s) | {len(during)} steps |",
            f"| pub2's steps contiguous, no resume, exit codes after SIGTERM | {contiguous} ({len(mc)} steps), "
            f"{sum('resumed from' in x for x in c.lines)} resumes, {codes} |",
            f"| pub0/pub1 peers counted during the cut (min, sapo.max_age_steps=3) | {low} |",
            f"| pub2 received records again after the link came back | {fmt_t(reads_again)} |",
            f"| pub0 / pub1 counted pub2 among their peers again after | {', '.join(fmt_t(t) for t in seen_again)} |",
        ]
    )


def _join_pairs(topo: str, steps: int, work: Path, extra: tuple[str, ...] = ()) -> dict:
    """Real nodes on every host of ``topo`` (the first bootstraps the rest, a start barrier); the share of (sender,
    reader) pairs where the reader trained on at least one of the sender's groups (``external_by_sender``)."""
    from protocol.identity import Identity

    t0 = time.monotonic()
    with Lab(parse(topo)) as lab:
        hosts = list(lab.hosts)
        nodes = _join_all(lab, work, steps, extra, barrier_s=300, timeout_s=1500, poll_s=3)
        codes = [n.proc.poll() for n in nodes]
        natted = {h for h, info in lab.hosts.items() if info.natted}
    ids = {Identity.load_or_create(work / h / "identity.key").peer_id: h for h in hosts}
    trained: dict[str, set[str]] = {}
    client = {}
    for n in nodes:
        ms = n.metrics()
        got = set()
        for m in ms:
            got |= {ids[s] for s in (m.get("external_by_sender") or {}) if s in ids}
        trained[n.host] = got
        client[n.host] = ms[-1].get("dht_client_mode") if ms else None
    pairs = [(s, r) for r in hosts for s in hosts if s != r]
    nat_pairs = [(s, r) for s, r in pairs if s in natted and r in natted]
    ok = lambda ps: sum(1 for s, r in ps if s in trained[r])  # noqa: E731
    return {
        "topology": topo,
        "exit": codes,
        "pairs": f"{ok(pairs)}/{len(pairs)}",
        "nat_pairs": f"{ok(nat_pairs)}/{len(nat_pairs)}" if nat_pairs else "-",
        "clients": sum(1 for v in client.values() if v == 1),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def scenario_nat_join(opts: argparse.Namespace, work: Path) -> str:
    homes = f"public={opts.public} homes={opts.homes} nat=symmetric"
    n = opts.public + sum(int(x) for x in opts.homes.split(","))
    rows = [
        (f"public={n}", (), "one segment"),
        (homes, (), "NAT, client_mode auto (default)"),
        (homes, ("--set", "transport.client_mode=false"), "NAT, every node a DHT server (old)"),
    ]
    lines = [
        "| swarm | topology | exit codes | (sender, reader) pairs trained on | NATed -> NATed | DHT clients | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (topo, extra, label) in enumerate(rows):
        if opts.nat_rows and str(i) not in opts.nat_rows.split(","):
            continue
        r = _join_pairs(topo, opts.train_steps, work / f"natjoin{i}", extra)
        print(json.dumps(r), file=sys.stderr, flush=True)
        lines.append(
            f"| {label} | `{topo}` | {r['exit']} | {r['pairs']} | {r['nat_pairs']} | {r['clients']} | {r['wall_s']} |"
        )
    return "\n".join(lines)


def _libp2p_run(topo: str, records: int, work: Path) -> dict:
    """py-libp2p peers (``tests/libp2p_isolated/peer_lp2p.py``) on every host; the share of (sender, reader) pairs
    where the reader got at least one of the sender's records."""
    import subprocess

    work.mkdir(parents=True, exist_ok=True)
    common = ["--host", "0.0.0.0", "--port", "31337", "--records", str(records), "--every", "3", "--duration", "75"]
    t0 = time.monotonic()
    with Lab(parse(topo)) as lab:
        hosts = list(lab.hosts)
        procs = {}
        boot = None
        for h in hosts:
            cmd = [sys.executable, "-m", "tests.libp2p_isolated.peer_lp2p", "--out", str(work / f"{h}.json")]
            cmd += [*common, "--tag", h, *(["--bootstrap", boot] if boot else [])]
            log = (work / f"{h}.log").open("w")
            procs[h] = lab.popen(h, cmd, stdout=subprocess.PIPE, stderr=log, text=True)
            if boot is None:
                for line in procs[h].stdout:
                    if line.startswith("listening on /ip4/") and not line.startswith("listening on /ip4/127."):
                        # the libp2p transport prints its listen address as is (/ip4/0.0.0.0/...): not dialable
                        boot = line.split()[-1].replace("/ip4/0.0.0.0/", f"/ip4/{lab.hosts[h].addr}/")
                        break
                if boot is None:
                    raise RuntimeError(f"libp2p peer in {h} printed no address; see {work / (h + '.log')}")
        for p in procs.values():
            p.communicate(timeout=200)
        natted = {h for h, info in lab.hosts.items() if info.natted}
    got = {h: set(json.loads((work / f"{h}.json").read_text())["tags"]) for h in hosts if (work / f"{h}.json").exists()}
    pairs = [(s, r) for r in hosts for s in hosts if s != r]
    nat_pairs = [(s, r) for s, r in pairs if s in natted and r in natted]
    ok = lambda ps: sum(1 for s, r in ps if s in got.get(r, set()))  # noqa: E731
    return {
        "topology": topo,
        "pairs": f"{ok(pairs)}/{len(pairs)}",
        "nat_pairs": f"{ok(nat_pairs)}/{len(nat_pairs)}" if nat_pairs else "-",
        "wall_s": round(time.monotonic() - t0, 1),
    }


def scenario_libp2p_nat(opts: argparse.Namespace, work: Path) -> str:
    lines = [
        "| swarm | topology | (sender, reader) pairs with a record | NATed -> NATed | wall s |",
        "|---|---|---|---|---|",
    ]
    for i, (topo, label) in enumerate(
        (("public=6", "one segment"), ("public=2 homes=2,2 nat=symmetric", "NAT (symmetric)"))
    ):
        r = _libp2p_run(topo, 3, work / f"lp2p{i}")
        print(json.dumps(r), file=sys.stderr, flush=True)
        lines.append(f"| {label} | `{topo}` | {r['pairs']} | {r['nat_pairs']} | {r['wall_s']} |")
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
