"""Summaries of timing samples: median, 95th percentile, and ratios between two ways."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """The distribution of one measured thing."""

    n: int
    """How many samples."""
    p50_ms: float
    """Median, milliseconds."""
    p95_ms: float
    """95th percentile (inclusive method), milliseconds."""
    mean_ms: float
    """Milliseconds."""
    min_ms: float
    """Milliseconds."""
    max_ms: float
    """Milliseconds."""


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """Seconds each of `n` calls of `fn` took."""
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def percentile(values: Sequence[float], q: int) -> float:
    """The `q`-th percentile (1..99) of `values`, interpolated between samples."""
    if not values:
        raise ValueError("no samples to summarize")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarize(seconds: Sequence[float]) -> Summary:
    """Summarize durations given in seconds; the summary is in milliseconds."""
    ms = sorted(s * 1000 for s in seconds)
    return Summary(
        n=len(ms),
        p50_ms=round(statistics.median(ms), 3),
        p95_ms=round(percentile(ms, 95), 3),
        mean_ms=round(statistics.fmean(ms), 3),
        min_ms=round(ms[0], 3),
        max_ms=round(ms[-1], 3),
    )


def ratio(baseline: Summary, ours: Summary) -> float:
    """How many times longer the baseline's median is than ours (> 1: ours is faster)."""
    return round(baseline.p50_ms / ours.p50_ms, 2)
