"""Sybils against a real node over whole runs: the honest share of the external groups it trains on (issue 33,
item 2; SPEC 11's run bound).

Real processes over real hivemind on 127.0.0.1: node A (``swarm-node join``, the built-in model, SAPO with the
node defaults J = 8, ``newcomer_share`` 0.25, ``establish_steps`` 3) runs ``--steps`` learner steps; a sybil process
(``tests/integration/hivemind_peer.py --sybils``) publishes valid, *informative* records (one group on a real task of
A's families, half right and half wrong, so A's re-scoring keeps it), each under a fresh throwaway identity, at
``--rates`` identities per window; once its first round is out, honest node B (``swarm-node join``) joins the flooded
swarm as a newcomer. Reported per rate, from A's ``metrics.jsonl`` (``external_by_sender``): external groups A
trained on over the whole run and from B's first record on, B's share of them (target: >= 0.5 over the run), how
many sybil identities were minted and how many got a group trained, and the identities per window the sybil process
actually achieved on this machine.

    python benchmarks/systems/sybil_real.py                       # 64 and 1,000 identities per window
    python benchmarks/systems/sybil_real.py --rates 64 --steps 40 --out /tmp/s.md

Writes ``benchmarks/results/sybil_real.md`` (or ``--out``) with the machine, the date and the command.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402
from benchmarks.systems.harness import stop_process, write_table  # noqa: E402

MADDR = re.compile(r"listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\S+)")
COMMON = [
    "--set", "model.threads=1",
    "--set", "eval.every_steps=null",
    "--set", "eval.at_start=false",
    "--set", "runtime.poll_interval_s=1.0",
]  # fmt: skip
#: A: the node defaults for SAPO (I = J = 8); 16 prompts a step of 4 completions.
A_JOIN = [*COMMON, "--set", "rollout.prompts_per_step=16", "--set", "rollout.group_size=4"]
#: B: draws more prompts, so it has informative groups to spare for A's established slots.
B_JOIN = [*COMMON, "--set", "rollout.prompts_per_step=12", "--set", "rollout.group_size=4"]


class Proc:
    """A child process with its output in a file; ended by pid (terminate, then kill)."""

    def __init__(self, name: str, cmd: list[str], tmp: Path) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = pattern.search(self.text())
            if m:
                return m
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {self.text()[-3000:]}")
            time.sleep(0.3)
        raise TimeoutError(f"{self.name}: {pattern.pattern!r} not seen in {timeout:.0f}s: {self.text()[-3000:]}")

    def stop(self) -> None:
        stop_process(self.proc, 60)


def join(name: str, tmp: Path, args: list[str]) -> Proc:
    return Proc(
        name,
        [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(tmp / name), "--config", "tiny", *args],
        tmp,
    )


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # the last line may be half written
            out.append(json.loads(line))
    return out


def one_rate(rate: int, args: argparse.Namespace, tmp: Path) -> dict:
    # A round a second-ish: `per_round` identities every `interval` seconds make `rate` a window.
    rounds_per_window = min(rate, max(1, args.window_seconds // 2))
    per_round = math.ceil(rate / rounds_per_window)
    interval = args.window_seconds / rounds_per_window
    run = tmp / f"rate{rate}"
    run.mkdir()
    a = join("a", run, ["--max-steps", str(args.steps), *A_JOIN])
    procs: list[Proc] = [a]
    t0 = time.time()
    try:
        maddr = a.wait_for(MADDR, 300).group(1)
        flood_start = time.time()
        sybils = Proc(
            "sybils",
            [sys.executable, "-m", "tests.integration.hivemind_peer", "--swarm", "rl-swarm-demo", "--bootstrap", maddr,
             "--sybils", str(per_round), "--publish-interval", f"{interval:.3f}", "--duration", "3600",
             "--sybil-concurrency", str(min(per_round, 16)), "--out", str(run / "sybils.jsonl")],
            run,
        )  # fmt: skip
        procs.append(sybils)
        sybils.wait_for(re.compile(r"^SYBILS \d+ \d+", re.M), 300)
        b = join("b", run, ["--peers", maddr, *B_JOIN])
        procs.append(b)
        b.wait_for(MADDR, 300)
        a.proc.wait(timeout=args.timeout)
        flood_end = time.time()
        rounds = re.findall(r"^SYBILS (\d+) (\d+)", sybils.text(), re.M)
        minted = int(rounds[-1][1]) if rounds else 0
    finally:
        for p in reversed(procs):
            p.stop()
    from protocol.identity import Identity

    honest = Identity.load_or_create(run / "b" / "identity.key").peer_id
    rows = read_jsonl(run / "a" / "metrics.jsonl")
    b_rows = [r for r in read_jsonl(run / "b" / "metrics.jsonl") if r.get("published", 0) > 0]
    b_first = b_rows[0]["time"] if b_rows else float("inf")

    def tally(rs: list[dict]) -> tuple[int, int, set[str]]:
        total = honest_n = 0
        trained_sybils: set[str] = set()
        for r in rs:
            by = r.get("external_by_sender") or {}
            total += sum(by.values())
            honest_n += by.get(honest, 0)
            trained_sybils |= {s for s in by if s != honest}
        return honest_n, total, trained_sybils

    h_all, t_all, syb_all = tally(rows)
    h_b, t_b, _ = tally([r for r in rows if r["time"] >= b_first])
    newcomer = sum(r.get("external_newcomer", 0) for r in rows)
    windows = max(1e-9, (flood_end - flood_start) / args.window_seconds)
    return {
        "rate": rate,
        "steps": len(rows),
        "wall_s": time.time() - t0,
        "minted": minted,
        "per_window": minted / windows,
        "external": t_all,
        "honest": h_all,
        "share": h_all / t_all if t_all else float("nan"),
        "external_since_b": t_b,
        "share_since_b": h_b / t_b if t_b else float("nan"),
        "newcomer_groups": newcomer,
        "sybils_trained": len(syb_all),
    }


def render(rows: list[dict], args: argparse.Namespace, command: str) -> str:
    ok = all(r["external"] > 0 and r["share"] >= 0.5 for r in rows)
    lines = [
        "# Sybils against a real node over whole runs: honest share of the external groups trained",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine_info(with_torch=False)}  ",
        f"Command: `{command}`",
        "",
        "Node A (`swarm-node join`, built-in model, SAPO I = J = 8, newcomer_share 0.25, establish_steps 3) "
        f"runs {args.steps} learner steps over real hivemind; a sybil process publishes valid informative records, "
        "each under a fresh identity, at the rate given (identities per 15-s window); honest node B joins the"
        " flooded swarm as a newcomer once the flood runs. Counted from A's `metrics.jsonl` over all its "
        "steps (B's share includes B's own newcomer phase) and from B's first published record on. SPEC 11 "
        "bound: newcomer groups <= 2 + E/3 over any stretch (E: established senders' groups), so B's share >="
        " 0.75 E / (E + 1.5).",
        "",
        "| identities / window (asked) | achieved / window | minted | A's steps | external groups trained "
        "| B's share (whole run) | B's share (from B's first record) | sybil groups trained "
        "| sybil identities trained | wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rate']:,} | {r['per_window']:.0f} | {r['minted']:,} | {r['steps']} | {r['external']} "
            f"| {r['share']:.3f} | {r['share_since_b']:.3f} | {r['external'] - r['honest']} | {r['sybils_trained']} "
            f"| {r['wall_s']:.0f} |"
        )
    lines += [
        "",
        f"Result: {'PASS' if ok else 'FAIL'} -- B's share of the external groups A trained >= 0.5 over the run.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=int, nargs="+", default=[64, 1000], help="fresh sybil identities per window")
    ap.add_argument("--steps", type=int, default=300, help="node A's learner steps (a whole run)")
    ap.add_argument("--window-seconds", type=int, default=15)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds node A gets for its run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sybil_real.md")
    args = ap.parse_args()
    command = "python benchmarks/systems/sybil_real.py " + " ".join(sys.argv[1:])
    rows = []
    with tempfile.TemporaryDirectory(prefix="sybil-real-") as td:
        for rate in args.rates:
            rows.append(one_rate(rate, args, Path(td)))
            print(json.dumps(rows[-1]), flush=True)
    text = render(rows, args, command)
    return write_table(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
