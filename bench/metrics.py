"""`metrics`: what reading every desktop's usage costs the service.

Two services side by side, each with the same number of idle desktops: one reads their
usage every 0.5 s (ten times the default rate, so the cost stands out of the noise), the
other every 600 s (no reading falls in the window: the baseline). The CPU time each
service process uses over the same window (its utime + stime from /proc) gives the cost
of one desktop's reading, and from it the share of a core the default interval (5 s)
takes per 100 desktops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench._cpu import CLOCK_TICKS, cpu_ticks
from bench._run import Options, Target, progress
from bench._service import Service, running_service

_FAST_S = 0.5
_DEFAULT_S = 5.0


@dataclass(frozen=True)
class MetricsResult:
    desktops: int
    window_s: float
    service_cpu_ms_per_s_reading: float
    """The service's CPU, ms per second, reading every desktop every 0.5 s."""
    service_cpu_ms_per_s_baseline: float
    """The same service with no reading in the window."""
    readings: int
    """Desktop readings the reading service took in the window."""
    us_per_desktop_reading: float
    """The difference, per desktop reading, microseconds."""
    core_pct_per_100_desktops_at_default: float
    """The share of one core 100 desktops read every 5 s would take, percent."""
    targets: list[Target]


def _cpu_s(pid: int) -> float:
    return (cpu_ticks(pid) or 0) / CLOCK_TICKS


def _busy(service: Service, desktops: int) -> None:
    for _ in range(desktops):
        service.create_desktop()


def run(options: Options) -> MetricsResult:
    desktops = 3 if options.quick else 10
    window_s = 5.0 if options.quick else 20.0
    with (
        running_service(CUBICLE_WARM_POOL="0", CUBICLE_METRICS_INTERVAL_S=str(_FAST_S)) as fast,
        running_service(CUBICLE_WARM_POOL="0", CUBICLE_METRICS_INTERVAL_S="600") as slow,
    ):
        progress(f"metrics: {desktops} desktops in each of two services")
        _busy(fast, desktops)
        _busy(slow, desktops)
        time.sleep(3.0)  # the creates' after-work settles
        pids = (fast.launched.process.pid, slow.launched.process.pid)
        progress(f"metrics: {window_s:.0f} s window")
        before = [_cpu_s(pid) for pid in pids]
        started = time.monotonic()
        time.sleep(window_s)
        after = [_cpu_s(pid) for pid in pids]
        elapsed = time.monotonic() - started
    fast_ms, slow_ms = ((a - b) * 1000 / elapsed for a, b in zip(after, before, strict=True))
    readings = int(elapsed / _FAST_S) * desktops
    per_reading_us = max(0.0, (fast_ms - slow_ms) * elapsed * 1000 / readings)
    default_share = per_reading_us * 100 / _DEFAULT_S / 1e6 * 100
    return MetricsResult(
        desktops=desktops,
        window_s=round(elapsed, 1),
        service_cpu_ms_per_s_reading=round(fast_ms, 2),
        service_cpu_ms_per_s_baseline=round(slow_ms, 2),
        readings=readings,
        us_per_desktop_reading=round(per_reading_us, 1),
        core_pct_per_100_desktops_at_default=round(default_share, 3),
        targets=[Target("readings of 100 desktops take < 1 % of a core", default_share < 1)],
    )
