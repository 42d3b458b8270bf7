"""The tables of docs/benchmarks.md, written from the committed result JSON (never typed by hand).

Every registered experiment (a ``configs/sim/*.yaml`` with a ``registration:`` block) whose result JSON is committed
under ``benchmarks/results/`` gets one section between the markers below: where it was registered, its verdict, the
per-arm table of the primary metric and the paired comparisons, each number a field of that JSON.

    python benchmarks/tables.py            # rewrite the generated part of docs/benchmarks.md
    python benchmarks/tables.py --check    # exit 1 if the committed tables differ from what this writes (a test)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- tables: written by `python benchmarks/tables.py` from benchmarks/results/*.json; do not edit -->"
END = "<!-- end of tables -->"


def registered() -> list[tuple[Path, Any, dict[str, Any]]]:
    """(YAML, registration, result JSON) of every registered experiment with a committed result, by file name."""
    sys.path.insert(0, str(ROOT))
    from sim.config import load_sim_config

    out = []
    for path in sorted((ROOT / "configs" / "sim").glob("*.yaml")):
        reg = load_sim_config(str(path)).registration
        result = ROOT / "benchmarks" / "results" / f"{reg.results}.json" if reg else None
        if result is not None and result.is_file():
            out.append((path, reg, json.loads(result.read_text())))
    return out


def section(path: Path, reg: Any, res: dict[str, Any]) -> list[str]:
    """One experiment's table: the per-arm primary metric and every paired comparison, from its JSON."""
    from sim.driver.stats import mean_sd

    p, prov = reg.primary, res["registration"]
    at = prov.get("registered") or {}
    lines = [
        f"### {res['name']}: {reg.question.split('?')[0]}?",
        "",
        f"`swarm-sim experiment {path.relative_to(ROOT)}` -> `benchmarks/results/{reg.results}.md`; registered at "
        f"commit {at.get('commit', '?')} on {at.get('date', '?')}, first result at commit "
        f"{prov.get('first_result') or '?'}; {len(reg.amendments)} amendment(s). {res['verdict']['text']}",
        "",
        f"| arm | role | seeds | {p} start | {p} end | paired diff against |",
        "|---|---|---:|---:|---:|---|",
    ]
    for arm, a in res["arms"].items():
        diffs = "; ".join(f"{c['control']} {c[p]['mean']:+.3f} [{c[p]['lo']:+.3f}, {c[p]['hi']:+.3f}]"
                          for c in res["comparisons"] if c["arm"] == arm)  # fmt: skip
        lines.append(f"| {arm} | {reg.arms[arm].role} | {len(a['seeds'])} | {mean_sd(a[p]['start'])} | "
                     f"{mean_sd(a[p]['end'])} | {diffs} |")  # fmt: skip
    return [*lines, ""]


def render(text: str) -> str:
    """``text`` (docs/benchmarks.md) with its generated part written anew (appended if it has none)."""
    body = [BEGIN, "", "## Registered experiments (generated)", ""]
    for path, reg, res in registered():
        body += section(path, reg, res)
    body.append(END)
    block = "\n".join(body)
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md's tables are not current")
    args = ap.parse_args()
    text = DOC.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{DOC} differs from its result JSON: run python benchmarks/tables.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
