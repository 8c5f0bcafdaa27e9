"""Shared by the evaluation tests: a model that answers each task from its own script, and
waiting for a run."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import httpx

from tests.agent.board_api import say
from tests.agent.fake_model import RecordedRequest, Turn
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "evals"
INSTRUCTIONS = {
    path.stem: json.loads(path.read_text())["instruction"] for path in SUITE.rglob("*.json")
}

PERFECT: dict[str, list[str]] = {
    "terminal-mkdir": [
        say("A shell is quickest.", type="exec", command="mkdir -p ~/projects/cubicle"),
        say("Created.", type="done", summary="made the folder"),
    ],
    "mousepad-append-line": [
        say("Go to the end of the list.", type="key", keys="ctrl+End"),
        say("Write the third item.", type="type", text="3. test the evals"),
        say("Save.", type="key", keys="ctrl+s"),
        say("Saved.", type="done", summary="added the line"),
    ],
    "chrome-counter": [
        *[say("Press the focused + button.", type="key", keys="space")] * 3,
        say("It shows 3.", type="done", summary="count is 3"),
    ],
    "os-infeasible-photoshop": [
        say("There is no Photoshop here.", type="fail", reason="Photoshop is not installed"),
    ],
}
"""What a model that knows how would answer, step by step, for a sample of the suite."""


class PerTask:
    """Answers each request from the script of the task its prompt names, in order;
    `fallback` answers a task whose script ran out (or that has none)."""

    def __init__(self, scripts: dict[str, Sequence[str | Turn]], fallback: str | Turn) -> None:
        self.scripts = {task: list(turns) for task, turns in scripts.items()}
        self.fallback = fallback
        self.asked: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> str | Turn:
        text = request.text
        task = next((t for t, words in INSTRUCTIONS.items() if words in text), None)
        with self._lock:
            if task is None:
                return self.fallback
            turn = self.asked[task]
            self.asked[task] += 1
        script = self.scripts.get(task, [])
        return script[turn] if turn < len(script) else self.fallback


def report_of(api: httpx.Client, run_id: str) -> dict:
    response = api.get(f"/api/evals/{run_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_done(api: httpx.Client, run_id: str, timeout_s: float = 180) -> dict:
    def done() -> dict | None:
        report = report_of(api, run_id)
        return report if report["run"]["status"] == "done" else None

    return wait_until(done, timeout_s, 0.5, f"evaluation run {run_id} to finish")
