"""Code contexts: the models of `POST /code` and `/contexts` (docs/code.md).

A context is a live process inside the desktop (IPython, bash or Node.js), so variables,
imports and open figures survive from one run to the next. A run answers NDJSON lines, one
`CodeEvent` each, in the shapes E2B's code interpreter streams (`type` names the event), so
the same events serve E2B's port-49999 surface unchanged.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from cubicle.protocol.errors import InvalidRequest
from cubicle.protocol.models import NO_NUL, EnvName

LANGUAGES = ("python", "bash", "javascript")
"""Languages a context can run: each runs in a process the desktop ships."""
_ALIASES = {"js": "javascript", "node": "javascript", "sh": "bash", "python3": "python"}


def language_of(name: str) -> str:
    """The language `name` means (`js` is `javascript`…); `InvalidRequest` if none."""
    language = name.strip().lower()
    language = _ALIASES.get(language, language)
    if language not in LANGUAGES:
        raise InvalidRequest(
            f"no context for language {name!r}: desktops run {', '.join(LANGUAGES)}"
        )
    return language


Language = Annotated[str, Field(min_length=1, max_length=64)]
"""A language name; one outside `LANGUAGES` is refused with what is served."""


class CreateContext(BaseModel):
    model_config = ConfigDict(extra="forbid")

    language: Language = "python"
    cwd: Annotated[str, Field(max_length=4096, pattern=NO_NUL)] | None = None
    """Working directory of the kernel inside the desktop; the home directory when absent."""


class ContextInfo(BaseModel):
    id: str
    language: str
    cwd: str
    """The kernel's working directory (absolute)."""


class RunCode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: Annotated[str, Field(max_length=16 * 1024 * 1024)]
    language: Language | None = None
    """The language's default context runs the code (created on first use); exclusive
    with `context_id`; Python when neither is given."""
    context_id: str | None = None
    env_vars: dict[EnvName, str] = Field(default_factory=dict)
    """Environment variables set in the kernel for this run only."""
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 300
    """Seconds before the run is interrupted (the context survives with its state)."""


class OutputEvent(BaseModel):
    type: Literal["stdout", "stderr"]
    text: str
    timestamp: int
    """Nanoseconds since the epoch when the guest read it."""


class ResultEvent(BaseModel):
    """One rich result: the last expression's value (`is_main_result`) or a display
    (a matplotlib figure, `display(df)`), in every format the kernel gave."""

    type: Literal["result"] = "result"
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
    json_: dict[str, object] | list[object] | None = Field(
        None, alias="json", serialization_alias="json"
    )
    javascript: str | None = None
    chart: dict[str, object] | None = None
    """What a matplotlib figure shows, as data: `type` (line, scatter, bar, pie,
    superchart, unknown), `title`, axis labels, ticks and scales, and `elements` (the
    series, bars or wedges), in E2B's chart shape."""
    data: dict[str, object] | None = None
    """A pandas DataFrame's columns, each a list of values (E2B's `data`)."""
    extra: dict[str, object] | None = None
    """Formats beside the named ones, by MIME type."""
    is_main_result: bool = False

    model_config = ConfigDict(populate_by_name=True)


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    name: str
    """The exception's class (`ZeroDivisionError`), or `TimeoutError` for a run past its
    timeout, or `KernelDied` when the kernel process ended under it."""
    value: str
    traceback: str
    """The traceback as IPython prints it, without colour codes."""


class CountEvent(BaseModel):
    type: Literal["number_of_executions"] = "number_of_executions"
    execution_count: int


class KeepaliveEvent(BaseModel):
    type: Literal["keepalive"] = "keepalive"


class EndEvent(BaseModel):
    type: Literal["end_of_execution", "unexpected_end_of_execution"] = "end_of_execution"


CodeEvent = Annotated[
    OutputEvent | ResultEvent | ErrorEvent | CountEvent | KeepaliveEvent | EndEvent,
    Field(discriminator="type"),
]
code_event_adapter: TypeAdapter[CodeEvent] = TypeAdapter(CodeEvent)


def event_line(event: BaseModel) -> bytes:
    """One NDJSON line of a run, without the formats a result lacks."""
    return event.model_dump_json(by_alias=True, exclude_none=True).encode() + b"\n"
