"""`cubicle eval`: run a suite on the service's task board, follow it, print the score.

    cubicle eval evals/ --model-url http://localhost:8001/v1 --model qwen2.5-vl-7b \\
        --attempts 2 --concurrency 2
    cubicle eval --stop RUN_ID       cubicle eval --resume RUN_ID       cubicle eval --list

The suite is read here and sent to the service with the files its tasks name, so the
service may run elsewhere. Model flags become a board profile (`eval-<hash>`, the same
settings always the same name); without them the run uses `--profile` (default: the
board's `default`). Ctrl-C stops the run; `--resume` goes on without rerunning finished
attempts.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import RootModel

from cubicle import AsyncServiceClient, InvalidRequest, ServiceUnreachable
from cubicle.client.sdk import service_address
from cubicle.protocol.board import ProfileView
from cubicle.protocol.evals import FINAL, EvalReport, EvalRun, Summary

POLL_S = 1.0
"""Seconds between looks at the run."""


class EvalRuns(RootModel[list[EvalRun]]):
    """What `GET /api/evals` answers."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", nargs="?", help="a folder or JSON file of OSWorld-format tasks")
    parser.add_argument("--model-url", help="OpenAI-compatible endpoint (OPENAI_BASE_URL)")
    parser.add_argument("--api-key", help="its API key")
    parser.add_argument("--model", help="the planner model")
    parser.add_argument(
        "--planner",
        choices=["json", "ui-tars", "anthropic", "openai-computer"],
        help="planner kind (default: by name)",
    )
    parser.add_argument("--grounder", help='grounders in order, e.g. "a11y,ocr,vlm"')
    parser.add_argument("--grounder-model", help="the vlm grounder's model")
    parser.add_argument("--allow-exec", action="store_true", help="let the planner run commands")
    parser.add_argument("--a11y-text", action="store_true", help="show it the a11y tree as text")
    parser.add_argument("--profile", default="default", help="a board profile, without --model")
    parser.add_argument("--attempts", type=int, default=1, help="tries per task (pass@k)")
    parser.add_argument("--concurrency", type=int, help="tasks at once (default: the board's)")
    parser.add_argument("--max-steps", type=int, help="step cap per attempt")
    parser.add_argument("--max-time", type=float, help="time cap per attempt, seconds")
    parser.add_argument("--tasks", help="only these task ids, comma-separated")
    parser.add_argument("--name", help="what the report calls the run")
    parser.add_argument("--json", help="write the final report to this file")
    parser.add_argument("--no-wait", action="store_true", help="start the run and return")
    parser.add_argument("--resume", metavar="RUN", help="go on with a stopped run")
    parser.add_argument("--stop", metavar="RUN", help="stop a running run")
    parser.add_argument("--list", action="store_true", help="list the service's runs")
    parser.add_argument("--url", help="the service (CUBICLE_URL, default http://127.0.0.1:8000)")
    parser.add_argument("--token", help="its token (CUBICLE_TOKEN, else the local token file)")


def _profile(args: argparse.Namespace) -> dict[str, Any] | None:
    """The board profile the model flags describe; None without model flags."""
    fields = {
        "base_url": args.model_url,
        "api_key": args.api_key,
        "planner_model": args.model,
        "planner_kind": args.planner,
        "grounder": args.grounder,
        "grounder_model": args.grounder_model,
        "allow_exec": args.allow_exec or None,
        "a11y_text": args.a11y_text or None,
    }
    given = {key: value for key, value in fields.items() if value is not None}
    return given or None


def _request(args: argparse.Namespace, profile: str) -> dict[str, Any]:
    from cubicle.evals.files import referenced_files
    from cubicle.evals.suite import load_suite

    suite = load_suite(Path(args.suite))
    files = referenced_files(suite)
    request: dict[str, Any] = {
        "tasks": [task.model_dump(mode="json", exclude_defaults=False) for task in suite.tasks],
        "files": {name: base64.b64encode(data).decode() for name, data in files.items()},
        "name": args.name or f"{suite.name} · {args.model or profile}",
        "profile": profile,
        "attempts": args.attempts,
    }
    if args.tasks:
        request["task_ids"] = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for key, value in (
        ("concurrency", args.concurrency),
        ("max_steps", args.max_steps),
        ("max_wall_s", args.max_time),
    ):
        if value is not None:
            request[key] = value
    return request


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def score_line(summary: Summary) -> str:
    """`12/30 passed = 40.0 % (95 % CI 24.6–57.7 %), pass@1 40.0 %…`"""
    text = f"{summary.passed}/{summary.scored} passed = {_percent(summary.rate)}"
    if summary.ci_low is not None and summary.ci_high is not None:
        low, high = summary.ci_low * 100, summary.ci_high * 100
        text += f" (95 % CI {low:.1f}–{high:.1f} %)"
    for k, value in summary.pass_at.items():
        text += f", pass@{k} {_percent(value)}"
    extras = [
        f"{summary.errors} errors" if summary.errors else "",
        f"{summary.unsupported} unsupported" if summary.unsupported else "",
    ]
    return text + "".join(f"; {e}" for e in extras if e)


async def _follow(service: AsyncServiceClient, run_id: str) -> EvalReport:
    seen: set[tuple[str, int]] = set()
    while True:
        report = await service.request("GET", f"/api/evals/{quote(run_id)}", model=EvalReport)
        total = len(report.items)
        for item in report.items:
            key = (item.task_id, item.attempt)
            if item.status in FINAL and key not in seen:
                seen.add(key)
                steps = f"{item.steps:>3} steps" if item.steps is not None else "         "
                took = f"{item.wall_s:6.1f} s" if item.wall_s is not None else ""
                which = f"{item.task_id} #{item.attempt}"
                print(f"[{len(seen):>3}/{total}] {item.status:<11} {which}  {steps} {took}")
                if item.status in ("error", "unsupported") and item.detail:
                    print(f"          {item.detail}", flush=True)
        sys.stdout.flush()
        if report.run.status != "running":
            return report
        await asyncio.sleep(POLL_S)


async def _main(args: argparse.Namespace) -> int:
    url, token = service_address(args.url, args.token)
    async with AsyncServiceClient(base_url=url, token=token, timeout_s=300) as service:
        if args.list:
            listed = await service.request("GET", "/api/evals", model=EvalRuns)
            for run in listed.root:
                print(f"{run.id}  {run.status:8} {run.tasks:>4} tasks  {run.name}")
            return 0
        if args.stop:
            path = f"/api/evals/{quote(args.stop)}/stop"
            run = await service.request("POST", path, model=EvalRun)
            print(f"stopped {run.id}: resume with `cubicle eval --resume {run.id}`")
            return 0
        if args.resume:
            path = f"/api/evals/{quote(args.resume)}/resume"
            run = await service.request("POST", path, model=EvalRun)
        else:
            if not args.suite:
                raise InvalidRequest("name a suite (a folder or JSON file of tasks), or --list")
            profile = args.profile
            if (fields := _profile(args)) is not None:
                digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
                profile = f"eval-{digest[:10]}"
                path = f"/api/board/profiles/{profile}"
                view = await service.request("PUT", path, json=fields, model=ProfileView)
                if not view.ready:
                    raise InvalidRequest(f"the model settings cannot run: {view.problem}")
            body = await asyncio.to_thread(_request, args, profile)
            run = await service.request("POST", "/api/evals", json=body, model=EvalRun)
        link = f"{url}/web/evals.html?run={run.id}&token={token}"
        print(
            f"run {run.id}: {run.tasks} tasks × {run.attempts} attempts, "
            f"{run.concurrency} at once, model {run.model}\nreport: {link}",
            flush=True,
        )
        if args.no_wait:
            return 0
        try:
            report = await _follow(service, run.id)
        except asyncio.CancelledError:
            stop = service.request("POST", f"/api/evals/{run.id}/stop", model=EvalRun)
            await asyncio.shield(stop)
            print(f"stopped: resume with `cubicle eval --resume {run.id}`", flush=True)
            raise
        print(f"score: {score_line(report.summary)}")
        print(f"report: {link}", flush=True)
        if args.json:
            await asyncio.to_thread(Path(args.json).write_text, json.dumps(report, indent=2))
        return 0


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130
    except ServiceUnreachable as exc:
        print(f"cubicle: {exc.message}", file=sys.stderr)
        return 1
