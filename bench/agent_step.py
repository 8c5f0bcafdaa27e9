"""`agent_step`: the agent's own cost per step, outside model time, with the a11y grounder.

One real service (`cubicle serve` in a subprocess), one real 1280×800 desktop with
mousepad open, and the real agent loop (`cubicle.agent.loop.Agent`, recording every step to disk)
with a scripted planner on the OpenAI-compatible fake model server (`tests/agent/
fake_model.py`), which answers at once, so what is measured is the agent: observe
(screenshot + decode) + ground (matching in the a11y tree, whose read starts as soon as the
screenshot is in and runs while the planner thinks: `Grounder.prepare`; what is left of the
read when the answer comes counts here) + act (input events) + settle (the guest's
`wait_for_settle`, 150 ms of quiet) per step, plus the planner's image preparation and the
model round trip to the fake server, reported apart. `overhead_outside_model` is the whole
step less the time spent waiting for the model, so no overlap hides anything there.

The steps alternate: click "the File menu" / "the Edit menu" / "the Help menu" (each
grounded in the accessibility tree), then `key Escape` (no grounding).

Baseline: the reference agents wait a fixed 1–2 s after every action instead of waiting
for the screen to settle; that sleep alone is their per-step overhead floor (their own
screenshot and action time come on top), so the comparison favours them.

    python -m bench.agent_step [--quick] [--settle-quiet-ms N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench._run import Target, machine, progress
from bench._service import Service, running_service
from bench._stats import summarize
from cubicle.agent._model import ChatModel
from cubicle.agent.grounding.a11y import A11yGrounder
from cubicle.agent.loop import Agent
from cubicle.agent.planner import ChatPlanner
from cubicle.agent.settings import RunLimits
from cubicle.agent.steps import StepRecord
from cubicle.agent.store import RunStore
from cubicle.client.sdk import AsyncDesktop
from tests.agent.fake_model import FakeModelServer

TARGET_P50_MS = 150.0
"""Issue target (15): observe + ground + act + settle, p50, with the a11y grounder."""
REFERENCE_SLEEP_MS = (1000.0, 2000.0)
"""The fixed sleep per step of the reference agents, milliseconds."""
MENUS = ("the File menu", "the Edit menu", "the Help menu")


def _say(**action: Any) -> str:
    return json.dumps({"thought": "benchmark step", "action": action})


def _script(measured: int) -> list[str]:
    turns = [_say(type="launch", app="mousepad")]
    for index in range(measured):
        if index % 2 == 0:
            turns.append(_say(type="click", target=MENUS[(index // 2) % len(MENUS)]))
        else:
            turns.append(_say(type="key", keys="Escape"))
    return [*turns, _say(type="done", summary="benchmark over")]


async def _measure(
    service: Service, server: FakeModelServer, measured: int, limits: RunLimits
) -> list[StepRecord]:
    info = service.create_desktop()
    token = service.client.headers["Authorization"].removeprefix("Bearer ")
    desktop = await AsyncDesktop.connect(info.id, base_url=service.url, token=token)
    steps: list[StepRecord] = []

    def heard(step: StepRecord) -> None:
        steps.append(step)
        grounded = f" → {step.grounded[0].source}" if step.grounded else ""
        progress(f"step {step.index}: {step.action_text}{grounded} {step.timings.total_ms:.0f} ms")

    server.script(_script(measured))
    model = ChatModel("fake-model", server.url, timeout_s=30)
    try:
        with tempfile.TemporaryDirectory(prefix="cubicle-bench-runs-") as runs:
            agent = Agent(
                desktop,
                ChatPlanner(model),
                A11yGrounder(desktop),
                limits=limits.model_copy(update={"max_steps": measured + 2}),
                store=RunStore(Path(runs)),
                on_step=heard,
                grounder_name="a11y",
            )
            record = await agent.run("Open each menu of the text editor and close it again")
    finally:
        await model.aclose()
        await desktop.close()
        service.kill_desktop(info.id)
    if record.status != "done" or any(step.error for step in steps):
        raise RuntimeError(f"the run did not go as scripted: {record.reason}; {steps}")
    return steps[1:-1]  # neither the launch nor the final `done`


def _summary(values_ms: list[float]) -> dict[str, float]:
    return asdict(summarize([value / 1000 for value in values_ms]))


def _figures(steps: list[StepRecord]) -> dict[str, Any]:
    timings = [step.timings for step in steps]
    clicks = [t for step, t in zip(steps, timings, strict=True) if step.grounded]
    core = [t.observe_ms + t.ground_ms + t.act_ms + t.settle_ms for t in timings]
    return {
        "steps": len(steps),
        "observe_ground_act_settle": _summary(core),
        "observe_ground_act_settle_clicks": _summary(
            [t.observe_ms + t.ground_ms + t.act_ms + t.settle_ms for t in clicks]
        ),
        "overhead_outside_model": _summary([t.overhead_ms for t in timings]),
        "stages_p50_ms": {
            name: _summary([getattr(t, name) for t in timings])["p50_ms"]
            for name in ("observe_ms", "ground_ms", "act_ms", "settle_ms", "model_ms")
        },
        "ground_clicks_p50_ms": _summary([t.ground_ms for t in clicks])["p50_ms"],
        "plan_minus_model_p50_ms": _summary([t.plan_ms - t.model_ms for t in timings])["p50_ms"],
        "unsettled_steps": sum(step.settled is False for step in steps),
    }


def run(quick: bool = False, settle_quiet_ms: int | None = None) -> dict[str, Any]:
    """Measure; the result as JSON-ready data. `settle_quiet_ms` overrides the loop's
    default quiet period (milliseconds without a screen change that count as settled).

    The same steps run twice on the same service, the settle as it was before the idle
    rule (the whole quiet period after every action: `settle_idle_ms` None) and as the
    agent now runs it (settled sooner once the desktop is idle), so the two figures come
    from the same machine at the same time."""
    measured = 12 if quick else 60
    limits = RunLimits()
    if settle_quiet_ms is not None:
        limits = limits.model_copy(update={"settle_quiet_ms": settle_quiet_ms})
    quiet_only = limits.model_copy(update={"settle_idle_ms": None})
    with running_service() as service, FakeModelServer() as server:
        before = asyncio.run(_measure(service, server, measured, quiet_only))
        steps = asyncio.run(_measure(service, server, measured, limits))
    ours = _figures(steps)
    baseline = _figures(before)
    p50 = ours["observe_ground_act_settle"]["p50_ms"]
    return {
        **ours,
        "settle_quiet_only": baseline,
        "ratio_vs_quiet_only_settle": round(
            baseline["observe_ground_act_settle"]["p50_ms"] / p50, 2
        ),
        "baseline_fixed_sleep_ms": list(REFERENCE_SLEEP_MS),
        "ratio_vs_1s_sleep": round(REFERENCE_SLEEP_MS[0] / p50, 2),
        "ratio_vs_2s_sleep": round(REFERENCE_SLEEP_MS[1] / p50, 2),
        "settle_quiet_ms": limits.settle_quiet_ms,
        "settle_idle_ms": limits.settle_idle_ms,
        "target": asdict(
            Target(
                f"observe + ground + act + settle p50 ≤ {TARGET_P50_MS:g} ms (a11y grounder)",
                p50 <= TARGET_P50_MS,
            )
        ),
        "machine": asdict(machine()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_step")
    parser.add_argument("--quick", action="store_true", help="12 steps instead of 60")
    parser.add_argument("--settle-quiet-ms", type=int, help="override the settle quiet period")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.quick, args.settle_quiet_ms), indent=2))


if __name__ == "__main__":
    main()
