"""The agent's branch of Cubicle's error tree (the root lives in `cubicle.protocol.errors`).

    CubicleError
    └── AgentError                the agent could not do what it was asked
        ├── GroundingError        a model answered, but the answer is not a usable point
        └── ModelError            a model endpoint failed (after retries where they make sense)
    NotFound
    ├── TaskNotFound              no such task on the board (404)
    └── ProfileNotFound           no such model profile on the board (404)

`openai` exceptions are translated into `ModelError` at one boundary, the grounder's (and
later the planner's) request method, with `raise ModelError(...) from exc`.
"""

from __future__ import annotations

from cubicle.protocol.errors import CubicleError, NotFound

_RAW_SHOWN = 300
"""Characters of a model answer quoted in an error message."""


def excerpt(text: str, limit: int = _RAW_SHOWN) -> str:
    """`text` as a repr, cut to about `limit` characters so a runaway answer stays readable."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters in all)"


class AgentError(CubicleError):
    """Root of the agent's errors."""

    code = "agent_error"


class GroundingError(AgentError):
    """The model answered, but its answer cannot be turned into a point on the screen.

    Either it does not parse in the model family's format, or it points off the screen.
    The message quotes the raw answer (truncated); `raw` keeps all of it.
    """

    code = "grounding_error"

    def __init__(self, message: str, *, raw: str | None = None) -> None:
        super().__init__(
            message if raw is None else f"{message}; the model answered {excerpt(raw)}"
        )
        self.raw = raw
        """The model's whole answer, untruncated (None when rebuilt from a wire error)."""


class ModelError(AgentError):
    """A model endpoint failed: unreachable, too slow, or it answered with an error status."""

    code = "model_error"

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.status = status
        """HTTP status the endpoint answered with; None for timeouts and connection errors."""
        self.attempts = attempts
        """How many requests were made before giving up."""


class TaskNotFound(NotFound):
    """No task with this id on the board."""

    code = "task_not_found"


class ProfileNotFound(NotFound):
    """No model profile with this name on the board."""

    code = "profile_not_found"
