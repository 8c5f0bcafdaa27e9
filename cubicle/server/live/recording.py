"""Recordings: the hub's H.264 packets muxed into MP4 as they are, plus a log of actions.

A `Recorder` is one more subscriber of the desktop's hub, so it starts at a keyframe (asked
of the guest) and costs no encoding. Time 0 of the video is the moment recording started:
the first keyframe, which arrives a little later, is shown from 0. Each packet lasts until
the next one. At the stop the recording asks for one more keyframe, of the screen as it is
then, and ends with it: browsers end a video at its last frame's start, so without it a
still screen would play only up to its last change. Every action run on the desktop while
it records (through the API or from a viewer) is logged with its offset into the video.

A recording started with `overlay=True` shows the actions on the picture as well (click
ripples, drag paths, scroll marks, captions of typed text and keys): its frames go through
a `cubicle.server.live.burnin.BurnIn` (decode, draw, encode) before they are muxed.

Files, in the recordings directory of the desktop: `<id>.mp4.part` while recording, then
`<id>.mp4` and `<id>.json` (the `ActionLog`). The MP4 is fragmented (a fragment at least
every second) and the log is saved about once a second while recording, so a service killed
mid-recording leaves a video that plays up to its last fragment and the actions logged until
then: the next start of the service finishes such files as `interrupted`
(`cubicle.server.live.recovery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterable
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import av

from cubicle.protocol import actions as a
from cubicle.protocol.errors import CubicleError
from cubicle.protocol.frames import EncodedFrame, Subscription
from cubicle.protocol.service import ActionEntry, ActionLog, ActionSource, RecordingInfo
from cubicle.server.live.burnin import BurnIn
from cubicle.server.live.hub import FrameHub
from cubicle.server.live.overlay import OverlayMessage

log = logging.getLogger("cubicle.streaming")

FIRST_FRAME_TIMEOUT_S = 5.0
"""How long a stopping recording still waits for its first frame."""
LAST_FRAME_TIMEOUT_S = 2.0
"""How long a stopping recording waits for its last frame: the screen at the stop."""
_MICROSECONDS = Fraction(1, 1_000_000)
_MIN_LAST_US = 33_333
"""Shortest duration given to the last frame: one frame at 30 fps."""
_FRAGMENTED = {
    # moov first (once the first frame gave the codec's parameters), then a fragment per
    # keyframe or per second: what was written plays even if the file is never closed.
    "movflags": "+frag_keyframe+empty_moov+delay_moov+default_base_moof",
    "frag_duration": "1000000",
    "flush_packets": "1",
}
_STILL_S = 2.0
"""Seconds without a frame after which a recording asks for a keyframe, so that the last
fragment reaches the disk (a still screen costs a keyframe every 2 s)."""


class _Mp4Writer:
    """An MP4 file being written from Annex-B H.264 access units; blocking, use in a thread."""

    def __init__(self, path: Path, width: int, height: int) -> None:
        self._container = av.open(str(path), "w", format="mp4", options=_FRAGMENTED)
        self._stream = self._container.add_stream("h264")
        self._stream.width, self._stream.height = width, height
        self._stream.time_base = _MICROSECONDS

    def write(self, frame: EncodedFrame, pts_us: int, duration_us: int) -> None:
        packet = av.Packet(frame.data)
        packet.pts = packet.dts = pts_us
        packet.duration = max(1, duration_us)
        packet.time_base = _MICROSECONDS
        packet.is_keyframe = frame.keyframe
        packet.stream = self._stream
        self._container.mux(packet)

    def close(self) -> None:
        self._container.close()


class Recorder:
    """One recording of one desktop, from `start()` to `stop()`."""

    def __init__(
        self, hub: FrameHub, directory: Path, desktop_id: str, *, overlay: bool = False
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.desktop_id = desktop_id
        self.directory = directory
        self._hub = hub
        self._info = RecordingInfo(
            id=self.id,
            desktop_id=desktop_id,
            status="recording",
            started_at=datetime.now(UTC),
            overlay=overlay,
        )
        self._burn_in: BurnIn | None = None
        self._entries: list[tuple[int, ActionSource, a.Action]] = []
        self._writer: _Mp4Writer | None = None
        self._t0: int | None = None
        """Hub-clock microseconds when recording started: time 0 of the video."""
        self._pending: EncodedFrame | None = None
        """The last frame received, written once the next one (or the stop) ends it."""
        self._pending_at = 0
        """Hub-clock microseconds from which the pending frame shows."""
        self._first = asyncio.Event()
        self._saved = (-1, 0.0)
        """(actions, `time.monotonic()`) at the last save of the log while recording."""
        self._closing_at: int | None = None
        """Hub-clock microseconds of the stop, once it began."""
        self._last = asyncio.Event()
        """Set once a frame of the stop's moment (or later) arrived."""
        self._task: asyncio.Task | None = None
        self._stopping: asyncio.Task | None = None
        self._subscription: Subscription | None = None

    @property
    def video_path(self) -> Path:
        return self.directory / f"{self.id}.mp4"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.id}.json"

    @property
    def _part(self) -> Path:
        return self.directory / f"{self.id}.mp4.part"

    @property
    def recording(self) -> bool:
        return self._info.status == "recording" and self._stopping is None

    def start(self) -> None:
        """Subscribe to the hub (which asks for a keyframe) and record from the next one."""
        if self._task is None:
            self._t0 = self._hub.clock_us()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._subscription = self._hub.subscribe(f"recording-{self.id}")
            frames: AsyncIterable[EncodedFrame] = self._subscription
            if self._info.overlay:
                self._burn_in = BurnIn(self._subscription, self._hub.clock_us)
                frames = self._burn_in
            self._task = asyncio.create_task(self._run(frames), name=self.id)

    def log(
        self,
        actions: list[a.Action],
        at_us: int,
        source: ActionSource,
        overlay: OverlayMessage | None = None,
    ) -> None:
        """Note actions that ran at `at_us` on the hub's clock, and draw their marks when
        the overlay is burned in."""
        if self.recording:
            self._entries.extend((at_us, source, action) for action in actions)
            if self._burn_in is not None and overlay is not None:
                self._burn_in.show(overlay, at_us)

    def info(self) -> RecordingInfo:
        return self._info.model_copy()

    def action_log(self) -> ActionLog:
        t0 = self._t0 if self._t0 is not None else 0
        return ActionLog(
            recording=self.info(),
            actions=[
                ActionEntry(offset_ms=max(0.0, (at - t0) / 1000), source=source, action=action)
                for at, source, action in self._entries
            ],
        )

    async def _run(self, frames: AsyncIterable[EncodedFrame]) -> None:
        assert self._t0 is not None
        iterator = aiter(frames)
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(anext(iterator), _STILL_S)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    # A still screen sends nothing, and a fragment is cut only when a frame
                    # comes: a keyframe now puts what was recorded so far safely on disk.
                    if self._writer is not None:
                        self._hub.request_keyframe()
                    continue
                if self._writer is None:
                    self._writer = await asyncio.to_thread(
                        _Mp4Writer, self._part, frame.width, frame.height
                    )
                    self._info.width, self._info.height = frame.width, frame.height
                    self._first.set()
                at = self._t0 if self._pending is None else max(frame.pts_us, self._pending_at + 1)
                if self._pending is not None:
                    await self._write(self._pending, self._pending_at, at)
                self._pending, self._pending_at = frame, at
                if self._closing_at is not None and at >= self._closing_at:
                    self._last.set()
        except (av.FFmpegError, OSError) as exc:
            log.warning("recording %s failed: %s", self.id, exc)
            self._info.reason = f"writing the video failed: {exc}"
        except CubicleError as exc:  # drawing the overlay failed
            log.warning("recording %s failed: %s", self.id, exc)
            self._info.reason = exc.message
        finally:
            if self._subscription is not None:
                self._subscription.close()

    async def _write(self, frame: EncodedFrame, start_us: int, end_us: int) -> None:
        """Write a frame shown from `start_us` to `end_us` (hub clock), and about once a
        second the log so far."""
        assert self._writer is not None and self._t0 is not None
        writer, t0 = self._writer, self._t0
        log_text = None
        if self._saved[0] != len(self._entries) and time.monotonic() - self._saved[1] > 1:
            self._saved = (len(self._entries), time.monotonic())
            log_text = self.action_log().model_dump_json(indent=1)

        def write() -> None:
            writer.write(frame, start_us - t0, end_us - start_us)
            if log_text is not None:
                self._save_log(log_text)

        await asyncio.to_thread(write)
        self._info.frames += 1

    def _save_log(self, text: str) -> None:
        """Replace the log on disk whole: a reader never sees half of one (blocking)."""
        staged = self.log_path.with_name(f"{self.id}.json.part")
        staged.write_text(text)
        os.replace(staged, self.log_path)

    async def stop(self) -> RecordingInfo:
        """Finish the file and the log; idempotent (a second call waits for the first)."""
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._finish(), name=f"finish-{self.id}")
        return await asyncio.shield(self._stopping)

    async def _finish(self) -> RecordingInfo:
        stopped_us = self._hub.clock_us()
        if self._pending is None and self._info.reason is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._first.wait(), FIRST_FRAME_TIMEOUT_S)
        if self._pending is not None and self._task is not None and not self._task.done():
            self._closing_at = stopped_us
            self._hub.request_keyframe()
            last = asyncio.create_task(self._last.wait())
            try:  # unless the frames end first (the desktop went away)
                await asyncio.wait(
                    {last, self._task},
                    timeout=LAST_FRAME_TIMEOUT_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                last.cancel()
                await asyncio.wait({last})
        if self._subscription is not None:
            self._subscription.close()
        if self._task is not None:
            await self._task
        self._info.stopped_at = datetime.now(UTC)
        try:
            await self._close_file(stopped_us)
        except (av.FFmpegError, OSError) as exc:
            self._info.reason = f"writing the video failed: {exc}"
        if self._info.reason is None:
            self._part.rename(self.video_path)
            self._info.status = "finished"
            self._info.bytes = self.video_path.stat().st_size
        else:
            self._info.status = "failed"
            self._part.unlink(missing_ok=True)
        text = self.action_log().model_dump_json(indent=1)
        await asyncio.to_thread(self._save_log, text)
        log.info("recording %s %s %s", self.id, self._info.status, self._info.reason or "")
        return self.info()

    async def _close_file(self, stopped_us: int) -> None:
        """Write the last frame, lasting until the stop, and close the file."""
        if self._writer is None or self._pending is None or self._t0 is None:
            self._info.reason = self._info.reason or (
                f"no video arrived from the desktop within {FIRST_FRAME_TIMEOUT_S:.0f} s"
            )
            return
        end = max(stopped_us, self._pending_at + _MIN_LAST_US)
        if self._info.reason is None:
            await self._write(self._pending, self._pending_at, end)
        await asyncio.to_thread(self._writer.close)
        self._info.duration_ms = (end - self._t0) / 1000


def read_log(path: Path) -> ActionLog:
    """A finished recording's log, as written by `Recorder.stop()`."""
    return ActionLog.model_validate_json(path.read_text())
