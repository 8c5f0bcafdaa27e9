"""Benchmarks that measure Cubicle side by side with the way reference products do the same.

Run `python -m bench [create screenshot click density] [--quick]`: one JSON document on
stdout (also written under `bench/results/`), progress on stderr. Each benchmark starts its
own service and its own reference desktops, measures both in the same run (interleaved
where the machine's noise matters), and cleans up everything it started.
"""

from bench._run import Options, Target
from bench._stats import Summary, ratio, summarize

__all__ = ["Options", "Summary", "Target", "ratio", "summarize"]
