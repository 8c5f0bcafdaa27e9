"""What `Desktop.run_code` returns: an `Execution` shaped like E2B's code interpreter's.

execution = d.run_code("import pandas as pd; df = pd.read_csv('sales.csv'); df.head()")
execution.text              # the last expression's text
execution.results[0].html   # the DataFrame as HTML
execution.logs.stdout       # printed chunks
execution.error             # None, or .name / .value / .traceback
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from cubicle.protocol.code import (
    CodeEvent,
    CountEvent,
    EndEvent,
    ErrorEvent,
    OutputEvent,
    ResultEvent,
    RunCode,
    code_event_adapter,
)
from cubicle.protocol.errors import ServiceUnreachable, raise_for_status

_FORMATS = (
    "text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript",
    "chart", "data",
)  # fmt: skip


@dataclass(frozen=True)
class Result:
    """One rich result: the last expression's value (`is_main_result`) or a display such
    as a matplotlib figure. Each format the context gave is set; the others are None."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    """Base64 PNG."""
    jpeg: str | None = None
    """Base64 JPEG."""
    pdf: str | None = None
    """Base64 PDF."""
    latex: str | None = None
    json: dict[str, Any] | list[Any] | None = None
    javascript: str | None = None
    chart: dict[str, Any] | None = None
    """A matplotlib figure's data: `type` (line, scatter, bar, pie, superchart, unknown),
    `title`, axes and `elements`, in E2B's chart shape."""
    data: dict[str, Any] | None = None
    """A pandas DataFrame's columns as lists."""
    extra: dict[str, Any] | None = None
    """Formats beside the named ones, by MIME type."""
    is_main_result: bool = False

    def formats(self) -> list[str]:
        """The names of the formats this result has."""
        found = [name for name in _FORMATS if getattr(self, name) is not None]
        return found + list(self.extra or {})


@dataclass(frozen=True)
class ExecutionError:
    name: str
    """The exception's class; `TimeoutError` past the run's timeout; `KernelDied` when the
    context's process ended (the next run restarts the context without its state)."""
    value: str
    traceback: str


@dataclass
class Logs:
    stdout: list[str] = field(default_factory=list)
    """Chunks printed to stdout, in order."""
    stderr: list[str] = field(default_factory=list)


@dataclass
class Execution:
    """The whole of one run."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The main result's text: what a notebook shows after `Out[n]:`."""
        return next((r.text for r in self.results if r.is_main_result), None)


OnOutput = Callable[[str], Any]
OnResult = Callable[[Result], Any]
OnError = Callable[[ExecutionError], Any]

_START_ALLOWANCE_S = 90.0
"""Seconds beyond the run's timeout to wait for its events (a context's start)."""


async def run_code(
    http: httpx.AsyncClient,
    path: str,
    request: RunCode,
    *,
    on_stdout: OnOutput | None = None,
    on_stderr: OnOutput | None = None,
    on_result: OnResult | None = None,
    on_error: OnError | None = None,
) -> Execution:
    """POST a run to `path` and fold its NDJSON events into an `Execution`, calling the
    callbacks as each event arrives."""
    execution = Execution()
    ended = False
    timeout = httpx.Timeout(request.timeout_s + _START_ALLOWANCE_S, connect=10.0)
    body = request.model_dump(exclude_none=True)
    try:
        async with http.stream("POST", path, json=body, timeout=timeout) as response:
            if response.status_code >= 400:
                raise_for_status(response.status_code, await response.aread())
            async for line in response.aiter_lines():
                if line:
                    event = code_event_adapter.validate_json(line)
                    ended = isinstance(event, EndEvent)
                    _fold(execution, event, on_stdout, on_stderr, on_result, on_error)
    except httpx.TransportError as exc:
        raise ServiceUnreachable(f"the run's answer was cut short: {exc!r}") from exc
    if not ended:
        raise ServiceUnreachable("the run's answer ended before its end_of_execution event")
    return execution


def _fold(
    execution: Execution,
    event: CodeEvent,
    on_stdout: OnOutput | None,
    on_stderr: OnOutput | None,
    on_result: OnResult | None,
    on_error: OnError | None,
) -> None:
    if isinstance(event, OutputEvent):
        (execution.logs.stdout if event.type == "stdout" else execution.logs.stderr).append(
            event.text
        )
        callback = on_stdout if event.type == "stdout" else on_stderr
        if callback is not None:
            callback(event.text)
    elif isinstance(event, ResultEvent):
        fields = event.model_dump(by_alias=True, exclude={"type"})
        result = Result(**fields)
        execution.results.append(result)
        if on_result is not None:
            on_result(result)
    elif isinstance(event, ErrorEvent):
        execution.error = ExecutionError(event.name, event.value, event.traceback)
        if on_error is not None:
            on_error(execution.error)
    elif isinstance(event, CountEvent):
        execution.execution_count = event.execution_count
