"""Every error Cubicle raises, in one tree.

    CubicleError
    ├── InvalidRequest            the caller asked for something that cannot be done as asked (422)
    │   ├── OffScreen             a coordinate lies outside the screen
    │   ├── UnknownKey            a key name that no keysym or alias matches
    │   └── PathNotAllowed        a file path outside what the files API may touch (403)
    ├── NotFound                  (404)
    │   ├── DesktopNotFound
    │   ├── WindowNotFound
    │   ├── FileNotFound
    │   ├── ViewerNotFound        a live-view session id that is not (or no longer) connected
    │   └── RecordingNotFound
    ├── Conflict                  the desktop's current state does not allow this now (409)
    ├── PayloadTooLarge           an upload over the configured limit (413)
    ├── DiskFull                  the desktop's own disk (disk_mb) has no room left (507)
    ├── DesktopUnavailable        the desktop exists but cannot take calls
    │   ├── DesktopStarting       still booting (409)
    │   └── DesktopGone           failed or stopped; `reason` says why (410)
    ├── CapacityReached           no room for another desktop (429)
    │   └── NoNodeAvailable       no cluster node could take the desktop in time (503)
    ├── Busy                      too many slow calls wait on this desktop: retry later (429,
    │                             with `Retry-After`)
    ├── AuthError                 missing or wrong token (401)
    │   └── Forbidden             a valid token that does not allow this call (403)
    ├── ServiceUnreachable        the SDK could not reach the Cubicle service (no HTTP status)
    └── SandboxError              the runtime or the guest broke (500/502)
        ├── SandboxStartError     a desktop did not come up
        ├── GuestUnreachable      the guest daemon stopped answering (502)
        └── A11yUnavailable       the accessibility bus (AT-SPI) cannot be reached

Each class carries a stable `code` that travels in error bodies (`ErrorBody`:
`{"error": code, "detail": message}`), so the guest, the control plane and the SDK raise
the same class on each side of the wire. HTTP status codes live in one table, `STATUS`;
`raise_for_status` turns an error answer back into its class (a code this side does not
know, into the branch of its status: `NotFound` for a 404).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel


class CubicleError(Exception):
    """Root of every error Cubicle raises on purpose."""

    code = "cubicle_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.status_code: int | None = None
        """The HTTP status the error arrived with, when it came over HTTP."""


class InvalidRequest(CubicleError):
    code = "invalid_request"


class OffScreen(InvalidRequest):
    code = "off_screen"


class NotSupported(InvalidRequest):
    """Valid, but not something this runtime or this host can do (and it says which can)."""

    code = "not_supported"


class UnknownKey(InvalidRequest):
    code = "unknown_key"


class PathNotAllowed(InvalidRequest):
    code = "path_not_allowed"


class NotFound(CubicleError):
    code = "not_found"


class DesktopNotFound(NotFound):
    code = "desktop_not_found"


class WindowNotFound(NotFound):
    code = "window_not_found"


class FileNotFound(NotFound):
    code = "file_not_found"


class ViewerNotFound(NotFound):
    code = "viewer_not_found"


class RecordingNotFound(NotFound):
    code = "recording_not_found"


class Conflict(CubicleError):
    code = "conflict"


class PayloadTooLarge(CubicleError):
    code = "payload_too_large"


class DiskFull(CubicleError):
    """A write inside the desktop met its disk's size (`disk_mb`): ENOSPC; or a write of the
    service met a full disk where its data directory is. Nothing half-written was kept."""

    code = "disk_full"


class DesktopUnavailable(CubicleError):
    code = "desktop_unavailable"


class DesktopStarting(DesktopUnavailable):
    code = "desktop_starting"


class DesktopGone(DesktopUnavailable):
    code = "desktop_gone"


class DesktopPaused(DesktopUnavailable):
    """The desktop is paused: nothing in it runs until it is resumed."""

    code = "desktop_paused"


class CapacityReached(CubicleError):
    code = "capacity_reached"


class NoNodeAvailable(CapacityReached):
    """No node of the cluster could take the desktop within the start timeout; the message
    names what was missing (a resource, memory, a node label)."""

    code = "no_node_available"


class Busy(CubicleError):
    """Too many slow calls (screenshots, files, a11y) already wait on one desktop.

    Answered at once with `Retry-After` rather than queued: a client that waits behind a
    queue it cannot see gets a later answer, and everyone else's calls wait too.
    """

    code = "busy"
    retry_after_s = 1
    """Seconds a client should wait before trying again (`Retry-After`)."""


class AuthError(CubicleError):
    code = "unauthorized"


class Forbidden(AuthError):
    """The token is valid but limited, e.g. a view-only share link asking for control."""

    code = "forbidden"


class ServiceUnreachable(CubicleError):
    """The SDK's request never got an answer: the service is down, or the address is wrong."""

    code = "service_unreachable"


class SandboxError(CubicleError):
    code = "sandbox_error"


class SandboxStartError(SandboxError):
    code = "sandbox_start_failed"


class GuestUnreachable(SandboxError):
    code = "guest_unreachable"


class PortClosed(SandboxError):
    """Nothing listens on the port a request was relayed to inside the desktop."""

    code = "port_closed"


class A11yUnavailable(SandboxError):
    """AT-SPI cannot be reached: no session D-Bus, or at-spi2-core (the a11y bus) missing."""

    code = "a11y_unavailable"


def error_classes() -> list[type[CubicleError]]:
    """Every error class defined so far, the root first (other rooms add branches)."""
    found: list[type[CubicleError]] = []
    pending: list[type[CubicleError]] = [CubicleError]
    while pending:
        cls = pending.pop(0)
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


_BRANCHES: dict[int, type[CubicleError]] = {
    401: AuthError,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    507: DiskFull,
}
"""The branch of an error whose code is unknown here, by its status (one branch each)."""


def from_code(code: str, message: str, status: int | None = None) -> CubicleError:
    """Rebuild the error a peer reported. A code this side does not know (a room of the
    service adds its own: the board's `task_not_found`) becomes the branch its status
    names (`NotFound` for 404…), else a plain `CubicleError`; it keeps the code it came
    with."""
    by_code = {cls.code: cls for cls in error_classes()}
    if code in by_code:
        return by_code[code](message)
    error = _BRANCHES.get(status, CubicleError)(message) if status else CubicleError(message)
    error.code = code
    return error


STATUS: dict[type[CubicleError], int] = {
    PathNotAllowed: 403,
    InvalidRequest: 422,
    NotFound: 404,
    Conflict: 409,
    PayloadTooLarge: 413,
    DiskFull: 507,
    DesktopStarting: 409,
    DesktopPaused: 409,
    DesktopGone: 410,
    DesktopUnavailable: 409,
    CapacityReached: 429,
    NoNodeAvailable: 503,
    Busy: 429,
    AuthError: 401,
    Forbidden: 403,
    GuestUnreachable: 502,
    PortClosed: 502,
    SandboxError: 500,
    CubicleError: 500,
}
"""HTTP status for each error class; the most specific class in an error's MRO wins."""


def status_for(exc: CubicleError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


class ErrorBody(BaseModel):
    """The body of every error answer, from the guest and from the service."""

    error: str
    """Stable error code, e.g. `off_screen`."""
    detail: str
    """What went wrong and what to do about it."""

    @classmethod
    def of(cls, exc: CubicleError) -> ErrorBody:
        return cls(error=exc.code, detail=exc.message)

    def to_error(self, status: int | None = None) -> CubicleError:
        """The error this body describes, of its own class where the code is known."""
        error = from_code(self.error, self.detail, status)
        error.status_code = status
        return error


def describe_validation(problems: Sequence[Mapping[str, Any]]) -> str:
    """One line for pydantic's validation errors: where, and what is wrong (first five)."""

    def one(problem: Mapping[str, Any]) -> str:
        where = ".".join(str(part) for part in problem.get("loc", ()) if part != "body")
        if problem.get("type") == "json_invalid":
            reason = problem.get("ctx", {}).get("error", "parse error")
            return f"the body is not valid JSON ({reason})"
        message = problem.get("msg", "invalid value")
        return f"{where}: {message}" if where else message

    return "; ".join(one(problem) for problem in problems[:5])


def raise_for_status(status: int, content: bytes) -> None:
    """Raise the error an answer carries (`ErrorBody`); nothing for a success status.

    An error answer that is not an `ErrorBody` (a proxy's page, say) still raises: an
    `AuthError` for 401, else a `CubicleError` quoting the start of the body.
    """
    if status < 400:
        return
    try:
        body = ErrorBody.model_validate_json(content)
    except ValueError:
        error = (
            AuthError("unauthorized: check the token")
            if status == 401
            else CubicleError(f"HTTP {status}: {content[:200].decode(errors='replace')}")
        )
        error.status_code = status
        raise error from None
    raise body.to_error(status)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
"""Codes of the plain HTTP errors a router raises itself (no route, wrong method)."""


@dataclass(frozen=True)
class ErrorAnswer:
    """What an HTTP server answers for an error: status, `ErrorBody`, extra headers."""

    status: int
    body: ErrorBody
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> bytes:
        return self.body.model_dump_json().encode()


def answer_for(exc: BaseException, *, log_hint: str) -> ErrorAnswer:
    """The one mapping from an error to its answer, for the guest and the service alike.

    A `CubicleError` answers with its code and the status of its class (`STATUS`), plus
    `WWW-Authenticate` or `Retry-After` where its class calls for them. A router's own HTTP
    error (anything with an int `status_code` and a `detail`, e.g. Starlette's
    `HTTPException`) keeps its status. Anything else is a 500 `internal_error` whose detail
    names the exception's type and `log_hint` (where its traceback was logged), never its
    message, which may hold what the caller should not see.
    """
    if isinstance(exc, CubicleError):
        headers: dict[str, str] = {}
        if isinstance(exc, AuthError):
            headers["WWW-Authenticate"] = "Bearer"
        elif isinstance(exc, Busy):
            headers["Retry-After"] = str(exc.retry_after_s)
        return ErrorAnswer(status_for(exc), ErrorBody.of(exc), headers)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and hasattr(exc, "detail"):
        code = _HTTP_CODES.get(status, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        return ErrorAnswer(status, ErrorBody(error=code, detail=str(exc.detail)), headers)
    detail = f"{type(exc).__name__}: see {log_hint}"
    return ErrorAnswer(500, ErrorBody(error="internal_error", detail=detail))
