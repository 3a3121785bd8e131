"""Round-based statistics for the H200 benchmarks: medians per round, the spread over rounds, and a
paired statistic with an interval (seeded bootstrap of the median over rounds, and the distribution-free
order-statistic interval of the median, which for n rounds covers the median with probability
1 - 2 * sum_{i<k} C(n, i) / 2^n; with k = 1 that is the min/max over rounds).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

SEED = 20261130
BOOTSTRAP = 4000


def bootstrap_median_ci(values: Sequence[float], level: float = 0.95, seed: int = SEED,
                        resamples: int = BOOTSTRAP) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the median of ``values`` (None under 3 values)."""
    vals = list(values)
    if len(vals) < 3:
        return None
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def order_interval(values: Sequence[float], level: float = 0.90) -> dict | None:
    """The widest-trimmed order-statistic interval ``[x_(k), x_(n+1-k)]`` for the median whose coverage
    is at least ``level`` (k = 1: min/max). None under 2 values."""
    vals = sorted(values)
    n = len(vals)
    if n < 2:
        return None

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= level:
        k += 1
    return {"low": vals[k - 1], "high": vals[n - k], "coverage": coverage(k), "k": k}


def spread(values: Sequence[float]) -> dict:
    vals = list(values)
    med = statistics.median(vals)
    quartiles = statistics.quantiles(vals, n=4) if len(vals) >= 4 else None
    return {"n": len(vals), "median": med, "min": min(vals), "max": max(vals),
            "iqr": quartiles[2] - quartiles[0] if quartiles else None,
            "rel_range": (max(vals) - min(vals)) / med if med else None}


def paired(per_round: Sequence[float]) -> dict:
    """Median of per-round paired values (differences or ratios) with both intervals and the spread."""
    vals = list(per_round)
    return {**spread(vals), "bootstrap95": bootstrap_median_ci(vals), "order_interval": order_interval(vals)}


__all__ = ["BOOTSTRAP", "SEED", "bootstrap_median_ci", "order_interval", "paired", "spread"]
