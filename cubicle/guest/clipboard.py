"""The desktop's clipboard, read and written in-process over the X selection protocol.

`Clipboard` keeps its own X connection and a thread that owns it: callers on any thread hand
requests to that thread through a queue, and the thread both runs them and answers other
applications' requests for the text it holds (`SelectionRequest`), as long as it owns the
`CLIPBOARD` selection. Text larger than one chunk (128 KiB) moves by the ICCCM `INCR`
protocol in both directions; 16 MiB of UTF-8 is the most either direction accepts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TypeVar

from Xlib import X, Xatom
from Xlib.display import Display
from Xlib.error import ConnectionClosedError, DisplayError, XError
from Xlib.protocol import event, rq
from Xlib.xobject.drawable import Window

from cubicle.protocol.errors import InvalidRequest, PayloadTooLarge, SandboxError

_log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0
"""How long `Clipboard.stop` waits for its thread."""
MAX_TEXT_BYTES = 16 * 1024 * 1024
"""Most bytes of UTF-8 text the clipboard takes or hands back."""
_CHUNK_BYTES = 128 * 1024
"""Bytes per property write; larger text goes by INCR in pieces of this size."""
_TRANSFER_TIMEOUT_S = 10.0
"""Seconds an INCR transfer to another application may take before it is dropped."""
_GRACE_S = 2.0
"""Seconds a caller waits for the clipboard thread beyond the request's own bound."""
_PROPERTIES = 4
"""Properties used in turn for reads, so a late answer to a timed-out read is not taken."""
_SERVED_TARGETS = ("UTF8_STRING", "STRING", "TEXT", "text/plain;charset=utf-8")

_T = TypeVar("_T")


@dataclass
class _Read:
    """One `get_text` call: which targets are left to try, and the text as it arrives."""

    future: Future[str]
    timeout_s: float
    """Seconds the whole read may take."""
    deadline: float
    """`time.monotonic()` seconds when the read gives up."""
    targets: list[str] = field(default_factory=lambda: ["UTF8_STRING", "STRING"])
    prop: int = X.NONE
    incr: bytearray | None = None
    """Bytes received so far when the owner sends by INCR."""
    incr_type: int = X.NONE


@dataclass
class _Transfer:
    """Text being handed to another application by INCR, one chunk per property deletion."""

    requestor: Window
    prop: int
    type_: int
    data: bytes
    deadline: float
    """`time.monotonic()` seconds when the transfer is dropped."""
    offset: int = 0
    """Bytes already written."""


class Clipboard:
    """The CLIPBOARD selection of one X display, served from a thread of its own."""

    def __init__(self, display_name: str | None = None) -> None:
        """`display_name` like `:7`; None means `$DISPLAY`. Nothing connects before `start()`."""
        self._display_name = display_name
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[tuple[Callable[[], None], Future]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._accepting = False
        self._closed_reason = "the clipboard is not started"
        self._wake_r = self._wake_w = -1
        # Set by start(), then used by the clipboard thread alone:
        self._display: Display
        self._window: Window
        self._text: str | None = None
        self._reads: list[_Read] = []
        self._transfers: dict[tuple[int, int], _Transfer] = {}
        self._serial = 0

    def start(self) -> None:
        """Connect to the display and start serving. Raises `SandboxError` if X is unreachable."""
        with self._lock:
            if self._thread is not None:
                if self._accepting:
                    return
                raise RuntimeError("A stopped Clipboard cannot start again; create a new one.")
            try:
                display = Display(self._display_name)
            except (DisplayError, ConnectionClosedError, OSError) as exc:
                raise SandboxError(
                    f"Cannot open X display {self._display_name or os.environ.get('DISPLAY')!r} "
                    f"for the clipboard ({exc}); check that Xvfb is running."
                ) from exc
            display.set_error_handler(_log_x_error)
            self._display = display
            self._window = display.screen().root.create_window(
                -10, -10, 1, 1, 0, X.CopyFromParent, event_mask=X.PropertyChangeMask
            )
            display.flush()
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self._accepting = True
            self._thread = threading.Thread(target=self._run, name="clipboard", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop serving, fail waiting calls, close the connection. Safe to call twice."""
        with self._lock:
            thread = self._thread
            if self._accepting:
                self._accepting = False
                self._closed_reason = "the clipboard was stopped"
                self._wake()
        if thread is not None:
            # Bounded: twice in CI a serving thread that had returned was never reaped by
            # the interpreter, and an unbounded join hung its caller for good.
            thread.join(timeout=STOP_TIMEOUT_S)
            if thread.is_alive():
                _log.warning("the clipboard's thread did not end within %s s", STOP_TIMEOUT_S)

    def set_text(self, text: str) -> None:
        """Own the CLIPBOARD selection and offer `text` to every application that pastes.

        Raises `PayloadTooLarge` over 16 MiB of UTF-8.
        """
        size = len(text.encode("utf-8"))
        if size > MAX_TEXT_BYTES:
            raise PayloadTooLarge(
                f"Clipboard text is {size} bytes of UTF-8; the limit is {MAX_TEXT_BYTES} bytes. "
                "Write large text to a file instead (PUT /files)."
            )
        future: Future[None] = Future()

        def own() -> None:
            try:
                self._own(text)
            except (SandboxError, XError) as exc:
                future.set_exception(exc)
            else:
                future.set_result(None)

        self._submit(own, future)
        self._result(future, _GRACE_S)

    def get_text(self, timeout_s: float = 2.0) -> str:
        """The clipboard's text; "" when no application owns the clipboard.

        Waits at most `timeout_s` seconds for the owning application to answer, then raises
        `SandboxError`. Raises `InvalidRequest` when the clipboard holds something that is not
        text, `PayloadTooLarge` when the text is over 16 MiB.
        """
        read = _Read(Future(), timeout_s, deadline=time.monotonic() + timeout_s)
        self._submit(lambda: self._enqueue_read(read), read.future)
        return self._result(read.future, timeout_s + _GRACE_S)

    # Caller side

    def _submit(self, request: Callable[[], None], future: Future) -> None:
        """Queue `request` for the clipboard thread; it settles `future` when done."""
        with self._lock:
            if not self._accepting:
                raise SandboxError(f"The clipboard cannot take calls: {self._closed_reason}.")
            self._requests.put((request, future))
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe holds wake-ups enough
            os.write(self._wake_w, b"\0")

    def _result(self, future: Future[_T], timeout_s: float) -> _T:
        try:
            return future.result(timeout_s)
        except FutureTimeout as exc:
            raise SandboxError(
                "The clipboard thread did not answer; the X server may be overloaded."
            ) from exc

    # Clipboard thread

    def _run(self) -> None:
        try:
            self._loop()
        except (ConnectionClosedError, OSError) as exc:
            _log.warning("clipboard lost its X connection: %s", exc)
            self._closed_reason = f"the connection to the X server broke ({exc})"
        except BaseException:
            _log.exception("clipboard thread failed")
            self._closed_reason = "the clipboard thread failed; see the guest log"
            raise
        finally:
            self._shut_down()

    def _loop(self) -> None:
        display = self._display
        while self._accepting:
            self._drain_wake()
            while not self._requests.empty():  # this thread is the only consumer
                request, future = self._requests.get_nowait()
                try:
                    request()
                except XError as exc:
                    if not future.done():
                        future.set_exception(SandboxError(f"The X server refused: {exc}."))
            while True:
                display.flush()
                if not display.pending_events():
                    break
                self._handle(display.next_event())
            timeout = self._expire(time.monotonic())
            display.flush()
            if not display.pending_events():
                select.select([display.fileno(), self._wake_r], [], [], timeout)

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # raised once the pipe is empty
            while os.read(self._wake_r, 4096):
                pass

    def _shut_down(self) -> None:
        with self._lock:
            self._accepting = False
        error = SandboxError(f"The clipboard cannot take calls: {self._closed_reason}.")
        futures = [read.future for read in self._reads]
        while not self._requests.empty():
            futures.append(self._requests.get_nowait()[1])
        for future in futures:
            if not future.done():
                future.set_exception(error)
        self._reads.clear()
        self._transfers.clear()
        with contextlib.suppress(ConnectionClosedError, OSError):
            self._display.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _atom(self, name: str) -> int:
        return self._display.intern_atom(name)

    def _own(self, text: str) -> None:
        self._text = text
        clipboard = self._atom("CLIPBOARD")
        self._window.set_selection_owner(clipboard, X.CurrentTime)
        if _id(self._display.get_selection_owner(clipboard)) != self._window.id:
            self._text = None
            raise SandboxError("Another application kept the clipboard; try again.")

    def _enqueue_read(self, read: _Read) -> None:
        self._reads.append(read)
        if len(self._reads) == 1:
            self._begin_read(read)

    def _begin_read(self, read: _Read) -> None:
        owner = _id(self._display.get_selection_owner(self._atom("CLIPBOARD")))
        if owner == X.NONE:
            self._finish(read, "")
        elif owner == self._window.id and self._text is not None:
            self._finish(read, self._text)
        else:
            self._serial += 1
            read.prop = self._atom(f"_CUBICLE_CLIPBOARD_{self._serial % _PROPERTIES}")
            self._convert(read)

    def _convert(self, read: _Read) -> None:
        self._window.delete_property(read.prop)
        target = self._atom(read.targets[0])
        self._window.convert_selection(self._atom("CLIPBOARD"), target, read.prop, X.CurrentTime)

    def _finish(self, read: _Read, text: str | None = None, error: Exception | None = None) -> None:
        if error is not None:
            read.future.set_exception(error)
        else:
            read.future.set_result(text or "")
        self._reads.remove(read)
        if self._reads:
            self._begin_read(self._reads[0])

    def _expire(self, now: float) -> float | None:
        """Drop what ran out of time; return seconds until the next deadline (None: none)."""
        if self._reads and self._reads[0].deadline <= now:
            read = self._reads[0]
            error = SandboxError(
                f"The application owning the clipboard did not hand over its text within "
                f"{read.timeout_s:g} s; try again, or copy the text again in that application."
            )
            self._finish(read, error=error)
        for key, transfer in list(self._transfers.items()):
            if transfer.deadline <= now:
                _log.info("dropping a clipboard transfer to window %#x", key[0])
                del self._transfers[key]
        deadlines = [t.deadline for t in self._transfers.values()]
        if self._reads:
            deadlines.append(self._reads[0].deadline)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _handle(self, ev: rq.Event) -> None:
        try:
            if ev.type == X.SelectionRequest:
                self._answer(ev)
            elif ev.type == X.SelectionNotify:
                self._on_notify(ev)
            elif ev.type == X.PropertyNotify:
                self._on_property(ev)
            elif ev.type == X.SelectionClear and ev.atom == self._atom("CLIPBOARD"):
                self._on_clear()
        except XError as exc:  # a window closed mid-conversation; its request dies with it
            _log.info("clipboard: X error while handling %s: %s", type(ev).__name__, exc)

    def _on_clear(self) -> None:
        """Another application copied; forget the text unless a later `set_text` won it back."""
        if _id(self._display.get_selection_owner(self._atom("CLIPBOARD"))) != self._window.id:
            self._text = None

    def _answer(self, ev: rq.Event) -> None:
        """Answer another application's `SelectionRequest` for the text this process owns."""
        prop = ev.property if ev.property != X.NONE else ev.target
        requestor: Window = ev.requestor
        target, text = ev.target, self._text
        ok = text is not None and ev.selection == self._atom("CLIPBOARD")
        if ok and target == self._atom("TARGETS"):
            atoms = [self._atom(name) for name in ("TARGETS", *_SERVED_TARGETS)]
            requestor.change_property(prop, Xatom.ATOM, 32, atoms)
        elif text is not None and ok and target in {self._atom(n) for n in _SERVED_TARGETS}:
            if target == Xatom.STRING:
                type_, data = Xatom.STRING, text.encode("latin-1", errors="replace")
            elif target == self._atom("text/plain;charset=utf-8"):
                type_, data = target, text.encode("utf-8")
            else:
                type_, data = self._atom("UTF8_STRING"), text.encode("utf-8")
            if len(data) <= _CHUNK_BYTES:
                requestor.change_property(prop, type_, 8, data)
            else:
                requestor.change_attributes(event_mask=X.PropertyChangeMask)
                requestor.change_property(prop, self._atom("INCR"), 32, [len(data)])
                deadline = time.monotonic() + _TRANSFER_TIMEOUT_S
                transfer = _Transfer(requestor, prop, type_, data, deadline)
                self._transfers[(requestor.id, prop)] = transfer
        else:
            ok = False
        notify = event.SelectionNotify(
            time=ev.time,
            requestor=requestor,
            selection=ev.selection,
            target=target,
            property=prop if ok else X.NONE,
        )
        requestor.send_event(notify)

    def _on_property(self, ev: rq.Event) -> None:
        window_id = ev.window.id
        if ev.state == X.PropertyDelete and (window_id, ev.atom) in self._transfers:
            transfer = self._transfers[(window_id, ev.atom)]
            chunk = transfer.data[transfer.offset : transfer.offset + _CHUNK_BYTES]
            transfer.requestor.change_property(transfer.prop, transfer.type_, 8, chunk)
            transfer.offset += len(chunk)
            if not chunk:  # the empty write ends the transfer
                del self._transfers[(window_id, ev.atom)]
                transfer.requestor.change_attributes(event_mask=0)
            return
        read = self._reads[0] if self._reads else None
        if (
            read is None
            or read.incr is None
            or window_id != self._window.id
            or ev.atom != read.prop
            or ev.state != X.PropertyNewValue
        ):
            return
        prop = self._window.get_full_property(read.prop, X.AnyPropertyType)
        self._window.delete_property(read.prop)
        chunk = prop.value if prop is not None and prop.format == 8 else b""
        if not chunk:
            self._finish(read, _decode(bytes(read.incr), read.incr_type))
            return
        read.incr += chunk
        read.incr_type = prop.property_type
        if len(read.incr) > MAX_TEXT_BYTES:
            self._finish(read, error=_too_large())

    def _on_notify(self, ev: rq.Event) -> None:
        """The owner's answer to our `ConvertSelection`: the text, INCR, or a refusal."""
        read = self._reads[0] if self._reads else None
        if (
            read is None
            or read.incr is not None
            or _id(ev.requestor) != self._window.id
            or ev.target != self._atom(read.targets[0])
            or ev.property not in (X.NONE, read.prop)  # else a late answer to an earlier read
        ):
            return
        if ev.property == X.NONE:
            read.targets.pop(0)
            if read.targets:
                self._convert(read)
            else:
                error = InvalidRequest(
                    "The clipboard holds something that is not text (the application that "
                    "copied it offers neither UTF8_STRING nor STRING)."
                )
                self._finish(read, error=error)
            return
        prop = self._window.get_full_property(read.prop, X.AnyPropertyType)
        self._window.delete_property(read.prop)  # for INCR, the deletion asks for chunk one
        if prop is not None and prop.property_type == self._atom("INCR"):
            if prop.format == 32 and prop.value and prop.value[0] > MAX_TEXT_BYTES:
                self._finish(read, error=_too_large())
            else:
                read.incr = bytearray()
        elif prop is not None and prop.format == 8:
            self._finish(read, _decode(prop.value, prop.property_type))
        else:
            error = SandboxError(
                "The application owning the clipboard answered without text; copy it again."
            )
            self._finish(read, error=error)


def _decode(data: bytes, type_: int) -> str:
    """Text from selection bytes: Latin-1 for `STRING`, UTF-8 for everything else."""
    return data.decode("latin-1" if type_ == Xatom.STRING else "utf-8", errors="replace")


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The clipboard holds more than {MAX_TEXT_BYTES} bytes of text; save it to a file in "
        "the application that copied it instead."
    )


def _id(window: Window | int) -> int:
    return window if isinstance(window, int) else window.id


def _log_x_error(error: XError, request: object) -> None:
    """X errors without a waiting caller, e.g. writing to a window that just closed."""
    _log.info("clipboard: X error %s", error)
