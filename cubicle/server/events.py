"""What happens to desktops, told to whoever listens: actions ran, a desktop parked or ended.

The sandbox manager emits these; other rooms subscribe (the live view logs actions into
recordings and closes what it holds for a desktop that ended) instead of being called by
routes or polling. Listeners run synchronously, in the order they subscribed, and must not
block: one that needs to wait starts a task it owns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cubicle.protocol import actions as a
from cubicle.protocol.service import ActionSource, DesktopStatus

log = logging.getLogger("cubicle.events")


@dataclass(frozen=True)
class ActionsRan:
    """A batch of actions ran on a desktop."""

    desktop_id: str
    actions: tuple[a.Action, ...]
    started: float
    """`time.monotonic()` seconds when the batch was sent to the desktop."""
    source: ActionSource
    """`api`: a program (an agent) through the API; `viewer`: a person in the browser."""
    result: a.ActionsResponse


@dataclass(frozen=True)
class DesktopEnded:
    """A desktop stopped or failed; it takes no more calls."""

    desktop_id: str
    status: DesktopStatus
    reason: str


@dataclass(frozen=True)
class DesktopParked:
    """A desktop paused without running programs (its disk, maybe its memory, kept by its
    runtime): what streamed from it ended; it streams again once resumed."""

    desktop_id: str


@dataclass(frozen=True)
class LinkRevoked:
    """A share link of a desktop was revoked: whatever it opened must close."""

    desktop_id: str
    link_id: str


DesktopEvent = ActionsRan | DesktopEnded | DesktopParked | LinkRevoked
Listener = Callable[[DesktopEvent], None]


class Events:
    """Fan-out of `DesktopEvent`s to the listeners subscribed now."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Hear every event from now on; returns the call that stops it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, event: DesktopEvent) -> None:
        """Tell every listener; one that raises is logged and the others still hear it."""
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a broken listener must not break the desktop's caller
                log.exception("a listener failed on %s", type(event).__name__)
