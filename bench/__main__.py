"""`python -m bench [names...] [--quick] [--max-desktops N]`: run benchmarks, print JSON.

The JSON document goes to stdout and to `bench/results/<names>-<timestamp>.json`; progress
goes to stderr. A missed target is reported in the JSON, not through the exit status; the
exit status is 1 only when a benchmark could not run (its error is in the JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    adapters,
    agent_step,
    board,
    board_step,
    click,
    client_install,
    code,
    create,
    density,
    e2b,
    egress,
    evals,
    grounding,
    hardening,
    live,
    load,
    metrics,
    microvm,
    pause,
    pointer,
    ports,
    ray,
    screenshot,
    soak,
    volumes,
)
from bench._run import Options, machine, progress

BENCHMARKS: dict[str, Callable[[Options], Any]] = {
    "create": create.run,
    "screenshot": screenshot.run,
    "click": click.run,
    "density": density.run,
    "grounding": lambda options: grounding.run(options.quick),
    "agent_step": lambda options: agent_step.run(options.quick),
    "live": lambda options: live.run(options.quick),
    "pointer": lambda options: pointer.run(options.quick),
    "board": board.run,
    "board_step": board_step.run,
    "adapters": adapters.run,
    "evals": lambda options: evals.run(options.quick),
    "ray": ray.run,
    "microvm": microvm.run,
    "load": load.run,
    "soak": soak.run,
    "hardening": hardening.run,
    "client_install": client_install.run,
    "code": code.run,
    "ports": ports.run,
    "egress": egress.run,
    "e2b": e2b.run,
    "pause": pause.run,
    "metrics": metrics.run,
    "volumes": volumes.run,
}
"""Name → the function that runs it and returns its result (a dataclass or a dict)."""
RESULTS = Path(__file__).resolve().parent / "results"


def _parse(argv: list[str] | None) -> tuple[list[str], Options]:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="name", help=f"any of {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer samples (< 90 s)")
    parser.add_argument("--max-desktops", type=int, default=40, help="density: most desktops")
    parser.add_argument("--soak-seconds", type=float, default=None, help="soak: how long")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}: pick from {', '.join(BENCHMARKS)}")
    return args.names or list(BENCHMARKS), Options(args.quick, args.max_desktops, args.soak_seconds)


def _run_one(name: str, options: Options) -> tuple[dict[str, Any], bool]:
    """The benchmark's result as JSON-ready data, and whether it ran."""
    progress(f"{name}: start")
    started = time.perf_counter()
    try:
        outcome = BENCHMARKS[name](options)
        result = outcome if isinstance(outcome, dict) else asdict(outcome)
    except Exception as exc:  # reported in the document; the other benchmarks still run
        traceback.print_exc(file=sys.stderr)
        return {"error": f"{type(exc).__name__}: {exc}"}, False
    result["duration_s"] = round(time.perf_counter() - started, 1)
    progress(f"{name}: done in {result['duration_s']} s")
    return result, True


def main(argv: list[str] | None = None) -> int:
    names, options = _parse(argv)
    started_at = datetime.now(UTC)
    document: dict[str, Any] = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": asdict(machine()),
        "options": asdict(options),
        "benchmarks": {},
    }
    all_ran = True
    for name in names:
        document["benchmarks"][name], ran = _run_one(name, options)
        all_ran = all_ran and ran
    text = json.dumps(document, indent=2)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    label = "all" if names == list(BENCHMARKS) else "+".join(names)
    path = RESULTS / f"{label}-{started_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(text + "\n")
    progress(f"wrote {path}")
    return 0 if all_ran else 1


if __name__ == "__main__":
    sys.exit(main())
