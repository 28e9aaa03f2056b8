"""Ratios a reviewer cannot argue with: the median of paired ratios, its distribution-free confidence
interval, a verdict, and the rule that says when enough rounds were timed.

A variant and its peer are timed strictly alternated (harness/bench.py ``time_paired``): round i gives
one time of each, so drift of clock or power between rounds moves both and cancels in their ratio.
The interval of the median is exact for any distribution of the per-round ratios (the k-th order
statistics of a sample bracket its median with binomial(n, 1/2) probability), so a heavy tail of
interrupted rounds neither needs a model nor moves it much, and no resampling makes it random.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
VERDICTS = ("faster", "same", "slower")


def median_interval_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """(lo, hi), 0-based ranks into n sorted samples whose values bracket the population median with at
    least ``confidence``; None when n is too small for any interval to reach it (n < 6 at 95 %).

    lo is the largest j with P(Binomial(n, 1/2) < j) <= (1 - confidence) / 2 (in 1-based ranks), and
    the interval is symmetric: hi = n - 1 - lo.
    """
    if n < 1:
        return None
    tail = (1.0 - confidence) / 2.0
    total = 2 ** n
    cdf, j = 0, 0  # cdf = sum_{i<j} C(n, i)
    while j < n:
        nxt = cdf + math.comb(n, j)
        if nxt / total > tail:
            break
        cdf, j = nxt, j + 1
    # j = how many order statistics lie strictly below the interval's lower end, plus one (1-based rank)
    if j == 0:
        return None
    return j - 1, n - j


@dataclass(frozen=True)
class Ratio:
    """The median of per-round ratios with its interval; ``verdict`` reads a ratio of a peer's time over
    the variant's: above 1 the variant is faster. ``same_within``: the verdicts' resolution (below)."""
    median: float
    lo: float
    hi: float
    n: int
    same_within: float = 0.0

    @property
    def halfwidth(self) -> float:
        """Half the interval, relative to the median: what the stopping rule drives down."""
        return (self.hi - self.lo) / 2.0 / self.median if self.median > 0 else math.inf

    @property
    def verdict(self) -> str:
        """faster (slower): the interval lies above (below) 1 and the median is more than ``same_within``
        away from 1; else same. Without the second condition a difference far below what the method resolves
        (an A/A's order effect of a few 1e-4 at a half-width of 2e-4) would read as a win."""
        if self.lo > 1.0 and self.median > 1.0 + self.same_within:
            return "faster"
        if self.hi < 1.0 and self.median < 1.0 - self.same_within:
            return "slower"
        return "same"  # the interval holds 1.0 (or is unbounded), or the difference is below the resolution


def paired_ratio(reference_times: Sequence[float], times: Sequence[float], confidence: float = CONFIDENCE,
                 same_within: float = 0.0) -> Ratio:
    """Median and interval of reference_i / times_i over rounds i (both timed in round i, one after the
    other). With the peer as the reference it is the variant's speedup over the peer."""
    if len(reference_times) != len(times):
        raise ValueError(f"paired samples differ in length: {len(reference_times)} and {len(times)}")
    if not times:
        raise ValueError("no paired rounds")
    if min(times) <= 0 or min(reference_times) <= 0:
        raise ValueError("a timed round has a non-positive time")
    ratios = sorted(r / t for r, t in zip(reference_times, times, strict=True))
    ranks = median_interval_ranks(len(ratios), confidence)
    lo, hi = (ratios[ranks[0]], ratios[ranks[1]]) if ranks else (-math.inf, math.inf)
    return Ratio(statistics.median(ratios), lo, hi, len(ratios), same_within)


@dataclass(frozen=True)
class StoppingRule:
    """Time more rounds until every ratio's relative half-width is at most ``target_halfwidth`` (and at
    least ``min_rounds`` were timed), or ``max_rounds`` is reached: small kernels get many rounds for
    little time, large ones stop as soon as they are sure. ``same_within``: the resolution of the ratios'
    verdicts (``Ratio.verdict``)."""
    target_halfwidth: float = 0.005
    min_rounds: int = 30
    max_rounds: int = 400
    same_within: float = 0.0

    def __post_init__(self):
        if not (0 < self.target_halfwidth < 1):
            raise ValueError(f"target_halfwidth must lie in (0, 1), got {self.target_halfwidth}")
        if not (0 <= self.same_within < 1):
            raise ValueError(f"same_within must lie in [0, 1), got {self.same_within}")
        if not (6 <= self.min_rounds <= self.max_rounds):
            raise ValueError(f"need 6 <= min_rounds <= max_rounds, got {self.min_rounds} and {self.max_rounds}")

    def done(self, ratios: Sequence[Ratio]) -> str | None:
        """Why to stop now ("target" or "cap"), or None to time another batch."""
        n = min((r.n for r in ratios), default=0)
        if n >= self.min_rounds and all(r.halfwidth <= self.target_halfwidth for r in ratios):
            return "target"
        if n >= self.max_rounds:
            return "cap"
        return None

    def next_batch(self, rounds_so_far: int) -> int:
        """Rounds to time next: min_rounds first, then as many again as were timed (the half-width shrinks
        as 1/sqrt(n), so doubling is the cheapest step that can reach the target), never past the cap."""
        step = self.min_rounds if rounds_so_far == 0 else rounds_so_far
        return max(0, min(step, self.max_rounds - rounds_so_far))
