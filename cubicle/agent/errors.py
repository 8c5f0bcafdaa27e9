"""The agent's branch of Cubicle's error tree (the root lives in `cubicle.protocol.errors`).

    CubicleError
    └── AgentError                the agent could not do what it was asked
        ├── GroundingError        a model answered, but the answer is not a usable point
        └── ModelError            a model endpoint failed (after retries where they make sense)
    NotFound
    ├── TaskNotFound              no such task on the board (404)
    └── ProfileNotFound           no such model profile on the board (404)

The vendors' exceptions (`openai`, `anthropic`) become `ModelError` where each request is
made, through one mapping, `model_error`: the same statuses read the same, with the same
hint, whichever vendor's client answered.
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


def _hint(status: int, model: str) -> str:
    if status in (401, 403):
        return "check the API key"
    if status == 404:
        return f"check the base URL (it usually ends in /v1) and the model name {model!r}"
    if status == 429:
        return "the endpoint is rate-limiting: slow down or raise its limits"
    if status >= 500:
        return f"check the server's log and that it serves {model!r}"
    return f"check that it serves {model!r} and that this model accepts images"


def model_error(exc: Exception, *, endpoint: str, model: str, attempts: int = 1) -> ModelError:
    """A vendor client's failure as a `ModelError`: an error status (anything with an int
    `status_code` and a `message`, as both `openai`'s and `anthropic`'s `APIStatusError`
    have) with a hint for that status, else an endpoint that could not be reached."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        tries = f" on all {attempts} attempts" if attempts > 1 else ""
        message = str(getattr(exc, "message", exc))
        return ModelError(
            f"{endpoint} answered HTTP {status}{tries}: {excerpt(message)}; {_hint(status, model)}",
            status=status,
            attempts=attempts,
        )
    return ModelError(f"cannot reach {endpoint}: {exc}", attempts=attempts)


class TaskNotFound(NotFound):
    """No task with this id on the board."""

    code = "task_not_found"


class ProfileNotFound(NotFound):
    """No model profile with this name on the board."""

    code = "profile_not_found"
