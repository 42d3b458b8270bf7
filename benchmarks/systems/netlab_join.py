"""The network lab's scenarios with real nodes (``netlab.py`` runs them): ``train`` and ``train-drop`` (real
``swarm-node join`` processes training), ``nat-join`` (which senders' groups each node behind NAT trained on) and
``libp2p-nat`` (py-libp2p peers on one segment and behind NAT).

Knows nothing about the lab's bare-peer scenarios or its command line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

from sim.netlab.lab import Lab
from sim.netlab.swarm import start_join
from sim.netlab.topology import parse

T = TypeVar("T")


def chosen(rows: list[T], picked: str) -> list[tuple[int, T]]:
    """The numbered rows a scenario runs: those whose number is in the comma-separated ``picked`` (all if empty)."""
    return [(i, row) for i, row in enumerate(rows) if not picked or str(i) in picked.split(",")]


def pair_shares(hosts: list[str], natted: set[str], got: dict[str, set[str]]) -> dict[str, str]:
    """Of all (sender, reader) pairs of ``hosts`` and of those both behind NAT: how many have the sender among
    ``got[reader]``, as "k/n" (``nat_pairs`` is "-" without NATed pairs)."""
    pairs = [(s, r) for r in hosts for s in hosts if s != r]
    nat_pairs = [(s, r) for s, r in pairs if s in natted and r in natted]
    ok = lambda ps: sum(1 for s, r in ps if s in got.get(r, set()))  # noqa: E731
    return {
        "pairs": f"{ok(pairs)}/{len(pairs)}",
        "nat_pairs": f"{ok(nat_pairs)}/{len(nat_pairs)}" if nat_pairs else "-",
    }


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
    return {
        "topology": topo,
        "exit": codes,
        **pair_shares(hosts, natted, trained),
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
    for i, (topo, extra, label) in chosen(rows, opts.nat_rows):
        r = _join_pairs(topo, opts.train_steps, work / f"natjoin{i}", extra)
        print(json.dumps(r), file=sys.stderr, flush=True)
        lines.append(
            f"| {label} | `{topo}` | {r['exit']} | {r['pairs']} | {r['nat_pairs']} | {r['clients']} | {r['wall_s']} |"
        )
    return "\n".join(lines)


def _libp2p_run(topo: str, records: int, work: Path) -> dict:
    """py-libp2p peers (``tests/libp2p_isolated/peer_lp2p.py``) on every host; the share of (sender, reader) pairs
    where the reader got at least one of the sender's records."""
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
    return {
        "topology": topo,
        **pair_shares(hosts, natted, got),
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
