"""The B1 gossip benchmarks' statistics and report: one run's metrics from its workers' result files, the sweep over
swarm sizes and repeats, medians and ratios against raw hivemind, and the Markdown table.

Imports neither hivemind nor libp2p; knows nothing about how peers are launched (``benchmarks.systems.gossip``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from benchmarks.common.machine import machine_info
from benchmarks.systems.gossip import COMPLETIONS, MEDIAN_KEYS


def summarize(
    mode: str, peers: int, results: list[dict], *, transport: str, guard_in_total: bool, require_all_peers: bool
) -> dict:
    """This run's metrics from the workers' result files.

    ``transport``: the mode whose codec share is reported (raw has none). ``guard_in_total``: the transport's
    receive-side guard runs outside publish and fetch, so it counts in the time spent too. ``require_all_peers``:
    a peer that died never saw anything, so every record counts as incomplete."""
    published: dict[str, float] = {}
    sizes: list[int] = []
    for r in results:
        published.update(r["published"])
        sizes += r["sizes"]
    # Records are identified by their content digest; a publisher's own records do not count for it, and a peer
    # that left the swarm midway (``left_at``) counts only as a publisher.
    lat = []
    for rid, tp in published.items():
        ts = [r["seen"].get(rid) for r in results if rid not in r["published"] and r.get("left_at") is None]
        lat.append(max(ts) - tp if ts and all(t is not None for t in ts) else float("inf"))
    if require_all_peers and len(results) < peers:
        lat = [float("inf")] * len(lat)
    lat.sort()
    complete = [x for x in lat if x != float("inf")]
    span = (max(published.values()) + max(complete) - min(published.values())) if complete else float("nan")
    parts = ("encode", "check", "publish", "fetch", "guard", "encode_cpu", "check_cpu", "guard_cpu")
    timing = {k: sum(r["timing"].get(k, 0.0) for r in results) for k in parts}
    # the CPU seconds of the codec parts, where the worker measured them (the hivemind benchmark does)
    has_cpu = bool(results) and all("guard_cpu" in r["timing"] for r in results)
    codec = timing["encode"] + timing["check"] + timing["guard"]
    total = timing["encode"] + timing["check"] + timing["publish"] + timing["fetch"]
    if guard_in_total:
        total += timing["guard"]
    size = statistics.mean(sizes) if sizes else 0.0
    # Per (record, reader) pair: how long until that reader had it (what a sampling reader waits for a record it
    # fetches), over the pairs that were delivered.
    pairs = sorted(
        r["seen"][rid] - tp
        for rid, tp in published.items()
        for r in results
        if rid not in r["published"] and r.get("left_at") is None and rid in r["seen"]
    )
    expected_pairs = sum(
        1 for rid in published for r in results if rid not in r["published"] and r.get("left_at") is None
    )
    if require_all_peers:  # a peer that died got nothing (its result file is missing)
        expected_pairs += max(0, peers - len(results)) * len(published)
    rss = [r["rss_bytes"] for r in results if r.get("rss_bytes")]
    pss = [r["pss_bytes"] for r in results if r.get("pss_bytes")]
    polls = sum(r["timing"].get("polls", 0) for r in results)
    return {
        # how long one poll's reads took (index and record fetches, not the pause between polls)
        "poll_mean_s": timing["fetch"] / polls if polls else float("nan"),
        # how long one publish took (the record and its index entries stored), after encode+sign
        "publish_mean_s": timing["publish"] / len(published) if published else float("nan"),
        # the share of (record, reader) pairs delivered at all: how close an incomplete record came
        "pairs_delivered": len(pairs) / expected_pairs if expected_pairs else float("nan"),
        "pair_p50_s": pairs[len(pairs) // 2] if pairs else float("nan"),
        "pair_p95_s": pairs[min(len(pairs) - 1, int(0.95 * len(pairs)))] if pairs else float("nan"),
        "rss_mb_median": statistics.median(rss) / 2**20 if rss else float("nan"),
        "rss_mb_max": max(rss) / 2**20 if rss else float("nan"),
        # with --launch fork, plus each peer's share of the zygote's PSS (the pages it shares with them)
        "pss_mb_median": (statistics.median(pss) + results[0].get("zygote_pss_bytes", 0) / len(results)) / 2**20
        if pss
        else float("nan"),
        "mode": mode,
        "peers": peers,
        "records": len(published),
        "incomplete": len(lat) - len(complete),
        "p50_s": lat[len(lat) // 2] if lat else float("nan"),
        "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else float("nan"),
        "records_per_s": len(complete) / span if complete and span > 0 else 0.0,
        "record_kb": size / 1024,
        "bytes_per_completion": size / COMPLETIONS,
        "codec_share": codec / total if mode == transport and total > 0 else float("nan"),
        # the codec share's parts: the publisher's encode+sign, the reader's checks, the transport's edge guard
        **{
            f"{part}_share": timing[part] / total if mode == transport and total > 0 else float("nan")
            for part in ("encode", "check", "guard")
        },
        # the same by the CPU the codec parts used, over the same (wall) transport time
        "codec_cpu_share": (
            (timing["encode_cpu"] + timing["check_cpu"] + timing["guard_cpu"]) / total
            if has_cpu and mode == transport and total > 0
            else float("nan")
        ),
        **{
            f"{part}_cpu_share": timing[f"{part}_cpu"] / total
            if has_cpu and mode == transport and total > 0
            else float("nan")
            for part in ("encode", "check", "guard")
        },
    }


def median_row(mode: str, peers: int, runs: list[dict]) -> dict:
    """One table row: incomplete records summed over the repeats, every other metric their median."""
    row = {"mode": mode, "peers": peers, "incomplete": sum(r["incomplete"] for r in runs)}
    for key in MEDIAN_KEYS:
        row[key] = statistics.median(r.get(key, float("nan")) for r in runs)
    return row


def add_ratios(rows: Iterable[dict], *, finite_raw_only: bool) -> None:
    """Set each row's ``ratio`` (p50 / raw's p50) for rows of one swarm size; ``finite_raw_only``: not when raw's
    p50 is inf (raw had most records incomplete)."""
    rows = list(rows)
    raw = next((r for r in rows if r["mode"] == "raw"), None)
    if raw is None or not raw["p50_s"] > 0 or (finite_raw_only and raw["p50_s"] == float("inf")):
        return
    for r in rows:
        r["ratio"] = f"{r['p50_s'] / raw['p50_s']:.2f}x"


# -- report -------------------------------------------------------------------------------------------------


def machine_line(package: str) -> str:
    """The results file's machine line: :func:`benchmarks.common.machine.machine_info` plus the load average."""
    return f"Machine: {machine_info((package,), with_torch=False)}; load average at start {os.getloadavg()[0]:.1f}."


def fmt(x: float, digits: int = 2) -> str:
    if x != x:  # nan
        return "-"
    if x == float("inf"):
        return "inf"
    return f"{x:.{digits}f}"


def render(transport: str, machine: str, description: str, rows: list[dict], notes: Sequence[str] = ()) -> str:
    """The results file: title, machine line, the workload ``description``, the table, ``notes``, the targets."""

    def pct(r: dict, key: str) -> str:
        v = r.get(key, float("nan"))
        return fmt(v * 100, 1) + "%" if v == v else "-"

    lines = [
        f"# B1 gossip: record dissemination over {transport}",
        "",
        machine,
        "",
        description,
        "",
        "| peers | mode | p50 visibility s | p95 visibility s | records/s | record KB | wire bytes/completion "
        "| codec share | incomplete | p50 vs raw |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['peers']} | {r['mode']} | {fmt(r['p50_s'])} | {fmt(r['p95_s'])} | {fmt(r['records_per_s'])} "
            f"| {fmt(r['record_kb'], 1)} | {fmt(r['bytes_per_completion'], 0)} | "
            f"{pct(r, 'codec_share')} | {r['incomplete']} | {r.get('ratio', '-')} |"
        )
    lines += [
        "",
        "Per reader and memory: p50/p95 over every (record, reader) pair of the time until that reader had the record; "
        "resident memory per peer at the end of the run (the Python process and its children, e.g. p2pd; PSS counts a "
        "page shared by k processes as 1/k, so PSS x peers is what the swarm takes); the mean "
        "time one poll's reads took (index and record fetches, not the pause between polls) and one publish took (the "
        "record and its index entries stored, after encode+sign); the share of (record, reader) pairs delivered at "
        "all.",
        "",
        "| peers | mode | reader p50 s | reader p95 s | RSS per peer MB (median) | RSS per peer MB (max) "
        "| PSS per peer MB (median) | poll s (mean) | publish s (mean) | pairs delivered |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['peers']} | {r['mode']} | {fmt(r.get('pair_p50_s', float('nan')))} "
            f"| {fmt(r.get('pair_p95_s', float('nan')))} | {fmt(r.get('rss_mb_median', float('nan')), 0)} "
            f"| {fmt(r.get('rss_mb_max', float('nan')), 0)} | {fmt(r.get('pss_mb_median', float('nan')), 0)} "
            f"| {fmt(r.get('poll_mean_s', float('nan')))} "
            f"| {fmt(r.get('publish_mean_s', float('nan')))} | {pct(r, 'pairs_delivered')} |"
        )
    parts = [r for r in rows if r.get("encode_share", float("nan")) == r.get("encode_share", float("nan"))]
    if parts:
        lines += [
            "",
            "The codec share's parts (shares of the same transport time): encode+sign at the publisher, the reader's "
            "receive checks (validate + decode, sharing the edge guard's decode), and the transport's edge guard (the "
            "DHT's store and lookup validation, in its own thread). *wall* times each part by the clock, which also "
            "counts the time its thread waited while another thread or process held one of the 2 cores; *CPU* by "
            "the CPU its own thread used (the codec's cost).",
            "",
            "| peers | mode | codec (CPU) | encode+sign wall / CPU | receive checks wall / CPU "
            "| edge guard wall / CPU |",
            "|---|---|---|---|---|---|",
        ]

    for r in parts:
        lines.append(
            f"| {r['peers']} | {r['mode']} | {pct(r, 'codec_cpu_share')} "
            f"| {pct(r, 'encode_share')} / {pct(r, 'encode_cpu_share')} "
            f"| {pct(r, 'check_share')} / {pct(r, 'check_cpu_share')} "
            f"| {pct(r, 'guard_share')} / {pct(r, 'guard_cpu_share')} |"
        )
    lines += [*notes, "", "Targets: 8 peers p50 <= 2 s; 32 peers p50 <= 10 s; codec share <= 5%.", ""]
    return "\n".join(lines)


def write(text: str, out: Path, name: str) -> None:
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
