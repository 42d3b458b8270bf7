"""A self-contained ``report.html`` of a simulator run: results table, reward curves, per-node detail.

One file, openable from disk with no network: inline CSS and inline SVG charts drawn here (no JavaScript, no
CDN, no fonts, no images on disk). Every string that comes from a config or a metrics file is HTML-escaped.
Reads the same :class:`sim.report.summary.ConfigResult` values as ``results.md`` plus, where a node wrote one, its
``eval.jsonl`` (held-out accuracy). Knows nothing about how the nodes were run.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")

CSS = """
body{margin:0;padding:16px 28px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2430;
background:#f6f7f9}h1{font-size:21px;margin:4px 0}
h2{font-size:16px;margin:18px 0 6px}h3{font-size:14px;margin:12px 0 4px}
section{background:#fff;border:1px solid #d8dde5;border-radius:6px;padding:8px 16px;margin:12px 0}
table{border-collapse:collapse}th,td{padding:3px 10px;border-bottom:1px solid #e3e6eb;text-align:left}
th{color:#5b6677;font-size:12px}td.n{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#5b6677}
svg{max-width:100%;height:auto}svg text{font-size:11px;fill:#5b6677}
"""


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 100 else f"{v:.1f}"
    return escape(str(v))


def svg_lines(
    series: Sequence[tuple[str, Sequence[float], Sequence[float], Sequence[tuple[float, float]] | None]],
    *,
    width: int = 720,
    height: int = 280,
    ylabel: str = "",
    xlabel: str = "step",
) -> str:
    """An inline SVG line chart: ``series`` = (label, xs, ys, optional (lo, hi) band per x)."""
    left, right, top, bottom = 48, 150, 26, 34
    xs_all = [x for _, xs, _, _ in series for x in xs]
    ys_all = [y for _, _, ys, _ in series for y in ys] + [
        v for _, _, _, band in series if band for lo_hi in band for v in lo_hi
    ]
    if not xs_all:
        return f'<svg viewBox="0 0 {width} 40"><text x="10" y="24">no data</text></svg>'
    x0, x1 = min(xs_all), max(xs_all)
    y0, y1 = min(0.0, min(ys_all)), max(ys_all)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    out = [f'<svg viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" role="img">']
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
    out.append(f'<text x="{left}" y="{height - 8}">{x0:g}</text>')
    out.append(f'<text x="{width - right}" y="{height - 8}" text-anchor="end">{x1:g}</text>')
    out.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>'
    )
    if ylabel:
        out.append(f'<text x="{left}" y="14" text-anchor="end">{escape(ylabel)}</text>')
    for i, (label, xs, ys, band) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        if band and xs:
            upper = " ".join(f"{sx(x):.1f},{sy(hi):.1f}" for x, (_, hi) in zip(xs, band, strict=True))
            lower = " ".join(f"{sx(x):.1f},{sy(lo):.1f}" for x, (lo, _) in reversed(list(zip(xs, band, strict=True))))
            out.append(f'<polygon points="{upper} {lower}" fill="{color}" fill-opacity="0.13" stroke="none"/>')
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        out.append(f'<text x="{width - right + 8}" y="{top + 12 + 15 * i}" style="fill:{color}">{escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], numeric_from: int = 1) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{_f(v)}</td>' if i >= numeric_from else f"<td>{_f(v)}</td>" for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
    return statistics.fmean(vals) if vals else None


def _node_rows(out: Path, res: Any) -> list[list[Any]]:
    rows = []
    for run in res.runs:
        for idx, metrics in sorted(run.nodes.items()):
            k = max(1, min(10, len(metrics) // 2))
            held = [e for e in run.evals.get(idx, []) if isinstance(e.get("accuracy"), int | float)]
            rows.append(
                [
                    f"seed{run.seed}/node{idx}",
                    len(metrics),
                    _mean(metrics[:k], "reward_mean"),
                    _mean(metrics[-k:], "reward_mean"),
                    math.fsum(float(r.get("reward_mean", 0.0)) for r in metrics),
                    sum(int(r.get("external_groups", 0)) for r in metrics),
                    int(metrics[-1].get("rejected", 0)) if metrics else 0,
                    float(held[0]["accuracy"]) if held else None,
                    float(held[-1]["accuracy"]) if held else None,
                ]
            )
    return rows


def write_html_report(out: str | Path, results: Sequence[Any], rows: Sequence[dict[str, Any]], title: str) -> Path:
    """Write ``out/report.html`` from the collected results and the results-table rows; return its path."""
    out = Path(out)
    # the laboratory families score 0 or 1: their reward is its exact twin, and "partial credit" would mislead
    partial = any(abs(r["cumulative_reward"] - r["cumulative_exact"]) > 1e-9 for r in rows)
    credit = "with the families' partial credit" if partial else "no partial credit: these families score 0 or 1"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p class='muted'>Simulator report written {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M UTC} from the per-node "
        f"metrics in this directory. Cumulative reward = reward_mean ({credit}) summed over nodes and steps (the "
        "SAPO paper's total reward), mean ± std over seeds; cumulative exact = its exact twin. Held-out exact = "
        "exact-match accuracy on problems no node trains on, first and last evaluation, mean over nodes; its gain "
        "is the learning measure, read against the majority baseline and pass@8.</p>",
        "<section><h2>Results</h2>",
        _table(
            [
                "config",
                "seeds",
                "nodes",
                "steps",
                "cumulative reward (partial credit)" if partial else "cumulative reward",
                "± std",
                "ratio",
                "cumulative exact",
                "final reward",
                "held-out exact start",
                "held-out exact end",
                "held-out gain",
                "± std",
                "majority baseline",
                "pass@8 start",
                "pass@8 end",
                "external",
                "rejected",
            ],
            [
                [
                    r["config"],
                    r["seeds"],
                    r["nodes"],
                    r["steps"],
                    r["cumulative_reward"],
                    r["cumulative_reward_std"],
                    r["ratio_vs_baseline"],
                    r["cumulative_exact"],
                    r["final_reward"],
                    r["heldout_start"],
                    r["heldout_end"],
                    r["heldout_gain"],
                    r["heldout_gain_std"],
                    r["heldout_majority"],
                    r["heldout_pass8_start"],
                    r["heldout_pass8_end"],
                    r["external_groups"],
                    r["rejected"],
                ]
                for r in rows
            ],
        ),
        "</section>",
    ]
    curves = []
    for res in results:
        steps, mean, lo, hi = res.curve()
        curves.append((res.name, steps, mean, list(zip(lo, hi, strict=True))))
    parts += [
        "<section><h2>Reward per step</h2><p class='muted'>line: mean over nodes; band: min–max node "
        "(averaged over seeds)</p>",
        svg_lines(curves, ylabel="reward"),
        "</section>",
    ]
    held_curves = [(res.name, *res.heldout_curve(), None) for res in results]
    held_curves = [c for c in held_curves if c[1]]  # configurations whose nodes evaluated
    if held_curves:
        parts += [
            "<section><h2>Held-out exact accuracy</h2><p class='muted'>exact-match accuracy on problems no node "
            "trains on, mean over nodes and seeds, at each evaluation: the learning measure (training reward can be "
            f"memorization{' or partial credit' if partial else ''})</p>",
            svg_lines(held_curves, ylabel="held-out exact accuracy"),
            "</section>",
        ]
    for res in results:
        node_series = []
        for run in res.runs:
            for idx, metrics in sorted(run.nodes.items()):
                node_series.append(
                    (
                        f"seed{run.seed}/node{idx}",
                        [int(r.get("step", i + 1)) for i, r in enumerate(metrics)],
                        [float(r.get("reward_mean", 0.0)) for r in metrics],
                        None,
                    )
                )
        parts += [
            f"<section><h2>Configuration {escape(res.name)}: per node</h2>",
            _table(
                [
                    "node",
                    "steps",
                    "reward first",
                    "reward last",
                    "cumulative",
                    "external groups",
                    "rejected",
                    "held-out first",
                    "held-out last",
                ],
                _node_rows(out, res),
            ),
            "<h3>Reward per step, each node</h3>",
            svg_lines(node_series, ylabel="reward", height=240),
            "</section>",
        ]
    parts.append("</body></html>\n")
    path = out / "report.html"
    path.write_text("".join(parts), encoding="utf-8")
    return path
