"""The paired analysis's arithmetic: seed lists and two-sided 95% Student-t intervals (no scipy for one table)."""

from __future__ import annotations

import math
import statistics

#: Student's t 0.975 quantiles for 1..30 degrees of freedom.
_T975 = (
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131),
    *(2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),
)


def parse_seeds(text: str) -> list[int]:
    """``0-3,7`` -> [0, 1, 2, 3, 7]."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def t975(df: int) -> float:
    """The two-sided 95% t multiplier; above 30 degrees of freedom the normal's 1.96 plus a 1/df correction."""
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def _sd(xs: list[float]) -> float:
    """The sample standard deviation, NaN when a value is (``statistics.stdev`` raises on NaN)."""
    return math.nan if any(math.isnan(x) for x in xs) else statistics.stdev(xs)


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95% t-interval of ``xs`` (NaN bounds for fewer than two values, or a NaN among them: an
    undefined metric, e.g. a gap closed where the peer starts no better)."""
    m = statistics.fmean(xs)
    if len(xs) < 2 or math.isnan(m):
        return m, math.nan, math.nan
    half = t975(len(xs) - 1) * _sd(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def interval(xs: list[float], kind: str = "t95") -> tuple[float, float, float]:
    """Mean and interval of ``xs`` by the registration's kind: ``t95`` (:func:`t_interval`) or ``sd2`` (mean ± 2
    sd)."""
    if kind == "t95" or len(xs) < 2:
        return t_interval(xs)
    m, sd = statistics.fmean(xs), _sd(xs)
    return m, m - 2 * sd, m + 2 * sd


def mean_sd(xs: list[float]) -> str:
    """``mean ± sd`` (or the one value) to three places."""
    return f"{statistics.fmean(xs):.3f} ± {_sd(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"
