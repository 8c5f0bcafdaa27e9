"""One encoded video stream per desktop, shared by every consumer inside the guest.

A `VideoSource` runs one thread that waits for X damage, grabs the rows that changed,
drops grabs identical to what it had and encodes the rest with libx264. The thread runs
while anyone subscribes: the first subscriber starts it, the last one to leave stops it
(the thread is joined and the encoder freed before the next one starts). When nothing
changes nothing is grabbed, encoded or sent, unless someone asks for a keyframe: then the
last picture is encoded again as an IDR.

The pointer is part of the picture: a `PointerWatch` wakes the thread when it moves or
changes shape (no polling), and the encoder draws it over the capture. A pointer that moves
over a still screen grabs nothing: only its old and new rectangles are converted again.

Each subscriber gets its own bounded queue on its event loop and starts at a keyframe. A
subscriber that falls behind loses frames until the next keyframe, which it asks for once it
has caught up; it never holds up the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cubicle.guest.video.capture import DamagedScreen
from cubicle.guest.video.encoder import H264Encoder
from cubicle.guest.video.pointer import Pointer, PointerWatch
from cubicle.protocol.errors import CubicleError, SandboxError
from cubicle.protocol.frames import EncodedFrame, Subscription

log = logging.getLogger(__name__)

MAX_FPS = 60


@dataclass(frozen=True)
class VideoStats:
    """What a video source did since it was made."""

    subscribers: int
    """Consumers reading now."""
    encoder_running: bool
    """A capture/encode thread is alive right now."""
    encoders_started: int
    """Capture/encode threads started so far (one per period with subscribers)."""
    fps: int
    """Capture rate cap now in force: the highest any subscriber asked for; 0 when idle."""
    frames_captured: int
    """Screen grabs (of the rows that changed); each follows a damage event."""
    frames_skipped: int
    """Grabs identical to the previous picture, not encoded."""
    frames_encoded: int
    """Access units produced, keyframes included."""
    pointer_frames: int
    """Of those, frames for a pointer that moved or changed shape over a still screen: only
    the pointer's old and new rectangles were converted."""
    keyframes: int
    """IDRs produced: a stream's first frame, and one per request."""
    frames_dropped: int
    """Frames a subscriber did not get because it was behind or waiting for a keyframe."""
    encode_seconds: float
    """Seconds spent converting and encoding (wall clock, summed)."""
    cpu_seconds: float
    """CPU seconds of the capture/encode threads (their thread clocks, summed): capture,
    change checks, BGRA→YUV and x264's main thread; x264's slice threads not included."""


class _Counters:
    """Mutable tallies behind `VideoStats`; plain numbers, each written by one thread."""

    def __init__(self) -> None:
        self.captured = self.skipped = self.encoded = self.keyframes = self.dropped = 0
        self.pointer_frames = 0
        self.encode_seconds = 0.0
        self.cpu_seconds_done = 0.0
        """CPU seconds of the threads that have ended."""


class VideoSource:
    """The live video of one X display: capture on change, encode once, hand out to many.

    `subscribe()` and `stop()` belong on the event loop; `request_keyframe()` and `stats()`
    may be called from any thread.
    """

    def __init__(self, display: str, *, max_queue: int = 60, crf: int = 23) -> None:
        self.display = display
        """X display to capture, e.g. `:1`."""
        self._max_queue = max_queue
        self._crf = crf
        self._lock = threading.Lock()
        self._subscriptions: set[Subscription] = set()
        self._worker: _Worker | None = None
        self._last_worker: _Worker | None = None
        self._workers_started = 0
        self._keyframe_wanted = False
        self._fps = 0
        self._stopped = False
        self._counters = _Counters()

    def subscribe(self, fps: int = 30) -> Subscription:
        """A new consumer; its first frame is a keyframe. Starts capture if it is idle."""
        if not 1 <= fps <= MAX_FPS:
            raise ValueError(f"fps must be between 1 and {MAX_FPS}, not {fps}")
        subscription = Subscription(self, max_frames=self._max_queue, name="frames", fps=fps)
        with self._lock:
            if self._stopped:
                raise SandboxError("the desktop's video source is stopped")
            self._subscriptions.add(subscription)
            self._fps = max(s.fps for s in self._subscriptions)
            self._keyframe_wanted = True
            if self._worker is None:
                self._workers_started += 1
                self._worker = _Worker(self, self._last_worker, self._workers_started)
                self._last_worker = self._worker
                self._worker.start()
            worker = self._worker
        worker.wake()
        return subscription

    def request_keyframe(self) -> None:
        """Make the next frame an IDR (SPS, PPS, IDR slice), even if the screen is still."""
        with self._lock:
            self._keyframe_wanted = True
            worker = self._worker
        if worker is not None:
            worker.wake()

    def stats(self) -> VideoStats:
        with self._lock:
            subscribers, fps = len(self._subscriptions), self._fps
            dropped = sum(s.dropped for s in self._subscriptions)
            last = self._last_worker
        running = last is not None and last.is_alive()
        counters = self._counters
        return VideoStats(
            subscribers=subscribers,
            encoder_running=running,
            encoders_started=self._workers_started,
            fps=fps,
            frames_captured=counters.captured,
            frames_skipped=counters.skipped,
            frames_encoded=counters.encoded,
            pointer_frames=counters.pointer_frames,
            keyframes=counters.keyframes,
            frames_dropped=counters.dropped + dropped,
            encode_seconds=counters.encode_seconds,
            cpu_seconds=counters.cpu_seconds_done + (last.cpu_seconds if running else 0.0),
        )

    async def stop(self) -> None:
        """End every subscription and wait for the capture thread to finish; idempotent."""
        with self._lock:
            self._stopped = True
            subscriptions = list(self._subscriptions)
            self._subscriptions.clear()
            worker, self._worker = self._worker, None
            last = self._last_worker
            self._fps = 0
        for subscription in subscriptions:
            self._counters.dropped += subscription.dropped
            _call(subscription, subscription.end)
        if worker is not None:
            worker.stop()
        if last is not None:
            await asyncio.to_thread(last.join)

    # --- for subscriptions and the worker -------------------------------------------------

    def detach(self, subscription: Subscription) -> None:
        """`subscription` is closed: it gets no more frames."""
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.discard(subscription)
                self._counters.dropped += subscription.dropped
            if self._subscriptions:
                self._fps = max(s.fps for s in self._subscriptions)
                return
            self._fps = 0
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def _take_keyframe_request(self) -> bool:
        with self._lock:
            wanted, self._keyframe_wanted = self._keyframe_wanted, False
        return wanted

    def _publish(self, frame: EncodedFrame) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            _call(subscription, subscription.offer, frame)

    def _fail(self, worker: _Worker, error: CubicleError) -> None:
        with self._lock:
            if self._worker is not worker:
                return  # it was already told to stop: nobody is waiting for its frames
            self._worker = None
            subscriptions = list(self._subscriptions)
            self._subscriptions.clear()
            self._fps = 0
        for subscription in subscriptions:
            self._counters.dropped += subscription.dropped
            _call(subscription, subscription.fail, error)


def _call(subscription: Subscription, fn: Callable[..., None], *args: object) -> None:
    """Run `fn` on the subscription's event loop, from any thread."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads it any more
        subscription.loop.call_soon_threadsafe(fn, *args)


class _Worker(threading.Thread):
    """The capture/encode thread of one period with subscribers."""

    def __init__(self, source: VideoSource, previous: _Worker | None, number: int) -> None:
        super().__init__(name=f"video-{number}", daemon=True)
        self.cpu_seconds = 0.0
        """CPU time this thread used so far."""
        self._source = source
        self._previous = previous
        self._stopping = False
        self._wake_lock = threading.Lock()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)

    def wake(self) -> None:
        """Interrupt the thread's wait (a keyframe request, a new fps, stop); any thread."""
        with self._wake_lock:
            if self._wake_write < 0:
                return
            with contextlib.suppress(BlockingIOError):  # a full pipe: a wake-up is pending
                os.write(self._wake_write, b"\0")

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    def run(self) -> None:
        started_cpu = time.thread_time()
        try:
            if self._previous is not None:  # one encoder at a time: let the last one finish
                self._previous.join()
                self._previous = None
            screen = DamagedScreen(self._source.display)
            try:
                watch = PointerWatch(self._source.display)
                try:
                    self._serve(screen, watch, started_cpu)
                finally:
                    watch.close()
            finally:
                screen.close()
        except CubicleError as exc:
            log.warning("live video stopped: %s", exc)
            self._source._fail(self, exc)
        except Exception as exc:  # a bug: tell the subscribers rather than leave them waiting
            log.exception("live video crashed")
            error = SandboxError(f"live video crashed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self._source._fail(self, error)
        finally:
            self.cpu_seconds = time.thread_time() - started_cpu
            self._source._counters.cpu_seconds_done += self.cpu_seconds
            with self._wake_lock:
                os.close(self._wake_read)
                os.close(self._wake_write)
                self._wake_read = self._wake_write = -1

    def _serve(self, screen: DamagedScreen, watch: PointerWatch, started_cpu: float) -> None:
        source, counters = self._source, self._source._counters
        encoder = H264Encoder(screen.width, screen.height, fps=source._fps or 30, crf=source._crf)
        try:
            started = time.monotonic()
            picture: bytearray | None = None
            pointer: Pointer | None = None
            last_pts = -1
            changed = True  # nothing captured yet
            moved = True  # nor the pointer read
            next_grab = started
            while not self._stopping:
                self.cpu_seconds = time.thread_time() - started_cpu
                changed = screen.take_damage() or changed
                moved = watch.take_events() or moved
                keyframe = source._keyframe_wanted
                now = time.monotonic()
                if (changed or moved) and now < next_grab:  # at most `fps` frames a second
                    self._wait([], next_grab - now)
                    continue
                if not (changed or moved or (keyframe and picture is not None)):
                    self._wait([screen.fileno(), watch.fileno()], None)  # idle until X or a wake
                    continue
                rows = range(0)  # nothing new on the screen: a keyframe, or the pointer moved
                if changed or moved:
                    next_grab = now + 1 / max(source._fps, 1)
                if changed:
                    changed = False
                    counters.captured += 1
                    if picture is None:
                        rows, picture = range(screen.height), screen.grab()
                    else:  # only the rows X said changed
                        rows, pixels = screen.grab_damaged()
                        if len(rows) == screen.height:
                            same, picture = pixels == picture, pixels
                        else:
                            stride = screen.width * 4
                            band = slice(rows.start * stride, rows.stop * stride)
                            same = picture[band] == pixels
                            picture[band] = pixels
                        if same:  # damaged, yet the same pixels
                            rows = range(0)
                            if not (keyframe or moved):
                                counters.skipped += 1
                                continue
                if moved:
                    moved = False
                    was, pointer = pointer, watch.read()
                    if was == pointer and not len(rows) and not keyframe:
                        continue  # moved away and back between two looks
                    counters.pointer_frames += not len(rows) and not keyframe
                assert picture is not None
                pts = max(round((now - started) * 1_000_000), last_pts + 1)
                last_pts = pts
                began = time.perf_counter()
                keyframe = source._take_keyframe_request()
                frame = encoder.encode(picture, pts, keyframe=keyframe, rows=rows, pointer=pointer)
                counters.encode_seconds += time.perf_counter() - began
                counters.encoded += 1
                counters.keyframes += frame.keyframe
                source._publish(frame)
        finally:
            encoder.close()

    def _wait(self, fds: list[int], timeout: float | None) -> None:
        """Sleep until one of `fds` (X connections) is readable, someone wakes us, or the
        timeout."""
        readable, _, _ = select.select([self._wake_read, *fds], [], [], timeout)
        if self._wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_read, 64):
                    pass
