"""Who drives a desktop from a browser, and how the browser's input reaches it.

Every open viewer (a WebRTC peer, or the fallback's WebSocket) joins the desktop's `Control`
under an id. One viewer at a time controls: taking control takes it from whoever had it,
whose held keys and buttons are let go first; the others stay view-only, and every viewer
hears who controls. Input from the controller becomes `cubicle.protocol.actions` and goes
through the same door as the REST API's actions (`SandboxManager.run_actions`), in order;
pointer moves that pile up while the guest is busy collapse into the last one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from cubicle.protocol import actions as a
from cubicle.protocol.errors import CubicleError, Forbidden, ViewerNotFound
from cubicle.server.live.keys import KeyboardState

log = logging.getLogger("cubicle.streaming")

Transport = Literal["webrtc", "mjpeg"]


# --- what the page sends ---------------------------------------------------------------------


class _Input(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PointerMove(_Input):
    type: Literal["move"]
    x: a.Coordinate
    """Screen pixels from the left edge."""
    y: a.Coordinate
    """Screen pixels from the top edge."""


class PointerButton(_Input):
    type: Literal["button"]
    x: a.Coordinate
    y: a.Coordinate
    button: a.Button
    down: bool


class Wheel(_Input):
    type: Literal["wheel"]
    x: a.Coordinate
    y: a.Coordinate
    dx: Annotated[int, Field(ge=-100, le=100)] = 0
    """Wheel clicks to the right (negative: left)."""
    dy: Annotated[int, Field(ge=-100, le=100)] = 0
    """Wheel clicks down (negative: up)."""


class KeyEvent(_Input):
    """A browser `keydown` or `keyup`, as `KeyboardEvent` describes it."""

    type: Literal["key"]
    key: str = Field(min_length=1, max_length=64)
    """`KeyboardEvent.key`: `a`, `A`, `é`, `Enter`, `ArrowLeft`, `Shift`, …"""
    code: str = Field(default="", max_length=64)
    """`KeyboardEvent.code`: `KeyA`, `ShiftLeft`, …"""
    down: bool
    shift: bool = False
    ctrl: bool = False
    alt: bool = False
    meta: bool = False
    altgr: bool = False
    """`getModifierState("AltGraph")`."""


class TextInput(_Input):
    """Text to type as is: a paste, or what an input method composed."""

    type: Literal["text"]
    text: str = Field(min_length=1, max_length=10_000)


class ReleaseAll(_Input):
    """Let go of every key and button held (the page lost focus)."""

    type: Literal["release"]


InputEvent = Annotated[
    PointerMove | PointerButton | Wheel | KeyEvent | TextInput | ReleaseAll,
    Field(discriminator="type"),
]
input_adapter: TypeAdapter[InputEvent] = TypeAdapter(InputEvent)


# --- what the page hears ---------------------------------------------------------------------


class ControlState(BaseModel):
    """Who controls a desktop, as one viewer sees it."""

    type: Literal["control"] = "control"
    viewer_id: str
    """The viewer this message is for."""
    controller: str | None
    """The viewer id in control, or None."""
    can_control: bool
    """Whether this viewer's token allows taking control."""


class InputProblem(BaseModel):
    type: Literal["error"] = "error"
    error: str
    """Stable error code, e.g. `forbidden`, `off_screen`."""
    detail: str


class Channel(Protocol):
    """How a viewer hears back; sending never blocks and never raises."""

    def send_text(self, text: str, *, droppable: bool = False) -> None:
        """Send one message; a `droppable` one (it matters only now) is dropped rather than
        kept while the channel cannot take it."""
        ...

    def close(self) -> None:
        """Hang up (the desktop is gone); idempotent."""
        ...


class Viewer:
    """One open live view of a desktop."""

    def __init__(self, channel: Channel, transport: Transport, *, can_control: bool) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.transport: Transport = transport
        self.can_control = can_control
        """Whether the token it connected with allows control."""
        self._channel = channel

    def send(self, message: BaseModel) -> None:
        self._channel.send_text(message.model_dump_json())

    def send_text(self, text: str, *, droppable: bool = False) -> None:
        self._channel.send_text(text, droppable=droppable)

    def hang_up(self) -> None:
        self._channel.close()


RunActions = Callable[[list[a.Action]], Awaitable[object]]
"""Runs a batch of actions on the desktop, raising the guest's error."""


class Control:
    """The viewers of one desktop and which of them controls it."""

    def __init__(
        self,
        run_actions: RunActions,
        *,
        name: str = "control",
        on_hand_over: Callable[[Viewer | None], None] = lambda _: None,
    ) -> None:
        self.name = name
        self.viewers: dict[str, Viewer] = {}
        self.controller: Viewer | None = None
        self._run_actions = run_actions
        self._on_hand_over = on_hand_over
        """Hears the new controller (None: no one) each time control changes hands."""
        self._keyboard = KeyboardState()
        self._buttons: dict[str, None] = {}
        self._queue: asyncio.Queue[tuple[Viewer, list[a.Action]]] = asyncio.Queue()
        self._pump: asyncio.Task | None = None

    # --- viewers ---------------------------------------------------------------------------

    def join(self, viewer: Viewer) -> None:
        self.viewers[viewer.id] = viewer
        viewer.send(self._state_for(viewer))

    def leave(self, viewer: Viewer) -> None:
        """Forget a viewer; if it controlled, control ends and its keys are let go."""
        self.viewers.pop(viewer.id, None)
        if self.controller is viewer:
            self._hand_over(None)

    def viewer(self, viewer_id: str) -> Viewer:
        try:
            return self.viewers[viewer_id]
        except KeyError:
            raise ViewerNotFound(
                f"no viewer {viewer_id!r} is connected to this desktop: open the live view "
                "first (the viewer id comes with the WebRTC answer or the WebSocket hello)"
            ) from None

    # --- control ---------------------------------------------------------------------------

    def take(self, viewer_id: str) -> ControlState:
        """Give control to a viewer, taking it from whoever had it."""
        viewer = self.viewer(viewer_id)
        if not viewer.can_control:
            raise Forbidden("this viewer's link is view-only: ask for a controlling link")
        if self.controller is not viewer:
            self._hand_over(viewer)
        return self._state_for(viewer)

    def release(self, viewer_id: str) -> ControlState:
        """Give control back (a viewer that does not control changes nothing)."""
        viewer = self.viewer(viewer_id)
        if self.controller is viewer:
            self._hand_over(None)
        return self._state_for(viewer)

    def _hand_over(self, viewer: Viewer | None) -> None:
        previous, self.controller = self.controller, viewer
        held = self._keyboard.release() + [a.MouseUp(button=b) for b in reversed(self._buttons)]
        self._buttons.clear()
        if held and previous is not None:
            self._enqueue(previous, held)
        log.info("%s: control %s → %s", self.name, previous and previous.id, viewer and viewer.id)
        self._on_hand_over(viewer)
        for each in self.viewers.values():
            each.send(self._state_for(each))

    def tell_all(self, message: BaseModel) -> None:
        """Tell every viewer something that matters only now (the action overlay): a viewer
        that cannot take it at once misses it."""
        text = message.model_dump_json()
        for viewer in self.viewers.values():
            viewer.send_text(text, droppable=True)

    def _state_for(self, viewer: Viewer) -> ControlState:
        return ControlState(
            viewer_id=viewer.id,
            controller=self.controller.id if self.controller else None,
            can_control=viewer.can_control,
        )

    # --- input -----------------------------------------------------------------------------

    def handle(self, viewer: Viewer, text: str) -> None:
        """Take one message from a viewer's page: check it, turn it into actions, queue them."""
        try:
            event = input_adapter.validate_json(text)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"])
            detail = f"bad input message: {where}: {problem['msg']}"
            viewer.send(InputProblem(error="invalid_request", detail=detail))
            return
        if viewer is not self.controller:
            viewer.send(InputProblem(error="forbidden", detail="take control first"))
            return
        actions = self._actions_for(event)
        if actions:
            self._enqueue(viewer, actions)

    def _actions_for(self, event: InputEvent) -> list[a.Action]:
        match event:
            case PointerMove(x=x, y=y):
                return [a.Move(x=x, y=y)]
            case PointerButton(x=x, y=y, button=button, down=True):
                self._buttons[button] = None
                return [a.MouseDown(x=x, y=y, button=button)]
            case PointerButton(x=x, y=y, button=button, down=False):
                self._buttons.pop(button, None)
                return [a.MouseUp(x=x, y=y, button=button)]
            case Wheel(x=x, y=y, dx=dx, dy=dy):
                return [a.Scroll(x=x, y=y, dx=dx, dy=dy)] if dx or dy else []
            case KeyEvent():
                return self._keyboard.translate(
                    key=event.key,
                    code=event.code,
                    down=event.down,
                    shift=event.shift,
                    ctrl=event.ctrl,
                    alt=event.alt,
                    meta=event.meta,
                    altgr=event.altgr,
                )
            case TextInput(text=text):
                return [a.Type(text=text)]
            case ReleaseAll():
                held = self._keyboard.release()
                held += [a.MouseUp(button=b) for b in reversed(self._buttons)]
                self._buttons.clear()
                return held
        return []

    def _enqueue(self, viewer: Viewer, actions: list[a.Action]) -> None:
        self._queue.put_nowait((viewer, actions))
        if self._pump is None:
            self._pump = asyncio.create_task(self._drain(), name=f"{self.name}-input")

    async def _drain(self) -> None:
        while True:
            viewer, batch = await self._queue.get()
            while not self._queue.empty():
                more_viewer, more = self._queue.get_nowait()
                if more_viewer is not viewer:
                    await self._run(viewer, _collapse_moves(batch))
                    viewer, batch = more_viewer, []
                batch.extend(more)
            await self._run(viewer, _collapse_moves(batch))

    async def _run(self, viewer: Viewer, batch: list[a.Action]) -> None:
        if not batch:
            return
        try:
            await self._run_actions(batch)
        except CubicleError as exc:
            log.info("%s: input from %s failed: %s", self.name, viewer.id, exc)
            viewer.send(InputProblem(error=exc.code, detail=exc.message))

    async def stop(self) -> None:
        """Hang up on every viewer and stop passing input on; idempotent."""
        for viewer in list(self.viewers.values()):
            viewer.hang_up()
        self.viewers.clear()
        self.controller = None
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            await asyncio.wait([pump])


def _collapse_moves(batch: list[a.Action]) -> list[a.Action]:
    """Drop each pointer move that another move follows directly: only the last one shows."""
    return [
        action
        for index, action in enumerate(batch)
        if not (
            isinstance(action, a.Move)
            and index + 1 < len(batch)
            and isinstance(batch[index + 1], a.Move)
        )
    ]
