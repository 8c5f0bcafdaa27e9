"""Everything live about each desktop: its hub, viewers, control, MJPEG feed and recordings.

`LiveDesktops` is built by the app's lifespan. It makes a `LiveDesktop` the first time a
desktop is watched, recorded or driven, and closes it (viewers hung up, recording finished,
reader stopped) once the desktop stopped, failed or was killed. A desktop that someone
watches or records counts as in use, so its idle timeout does not run out under a viewer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from pydantic import BaseModel, TypeAdapter, ValidationError

from desktop import actions as a
from desktop.errors import Conflict, DesktopNotFound, NotFound, RecordingNotFound
from desktop.manager import SandboxManager
from desktop.models import DesktopInfo
from streaming.control import Control, ControlState, Transport
from streaming.guest_source import GuestFrames
from streaming.hub import FrameHub, HubStats
from streaming.mjpeg import JpegFeed
from streaming.recording import ActionLog, ActionSource, Recorder, RecordingInfo, read_log
from streaming.source import VideoStats
from streaming.webrtc import WebRtcViewer

log = logging.getLogger("cubicle.streaming")

SWEEP_S = 0.5
"""How often desktops that ended are looked for, seconds."""
_VIDEO_STATS = TypeAdapter(VideoStats)
"""Reads the guest's `GET /frames/stats` (the guest's own `VideoStats`, as JSON)."""


class ViewerInfo(BaseModel):
    id: str
    transport: Transport
    can_control: bool
    controlling: bool


class LiveState(BaseModel):
    """What is live on one desktop right now."""

    desktop: DesktopInfo
    viewers: list[ViewerInfo]
    controller: str | None
    """Id of the viewer in control, or None."""
    stream: HubStats
    """The one H.264 stream every WebRTC viewer and recording shares, on the host."""
    encoder: VideoStats | None
    """The same stream at its source, in the guest; None if the guest does not say."""
    mjpeg_watchers: int
    recording: RecordingInfo | None
    """The recording running now, if any."""


class LiveDesktop:
    """The live side of one desktop."""

    def __init__(self, desktop_id: str, manager: SandboxManager, recordings: Path) -> None:
        self.id = desktop_id
        self._manager = manager
        self._recordings_dir = recordings / desktop_id

        def guest():
            return manager.guest(desktop_id)

        self.hub = FrameHub(GuestFrames(guest), name=f"video-{desktop_id}")
        self.jpeg = JpegFeed(guest, name=f"mjpeg-{desktop_id}")
        self.control = Control(self._run_viewer_actions, name=f"control-{desktop_id}")
        self.peers: dict[str, WebRtcViewer] = {}
        self.recorder: Recorder | None = None
        """The recording running now; finished ones are files."""
        self._guest = guest

    @property
    def in_use(self) -> bool:
        return bool(self.control.viewers or self.jpeg.watchers or self.recorder)

    # --- viewers ---------------------------------------------------------------------------

    async def add_webrtc_viewer(
        self, offer_sdp: str, *, can_control: bool
    ) -> tuple[WebRtcViewer, str]:
        """A new WebRTC viewer for the browser that sent `offer_sdp`, and the SDP answer."""
        viewer = WebRtcViewer(
            self.hub,
            self.control,
            can_control=can_control,
            on_closed=lambda v: self.peers.pop(v.id, None),
        )
        self.peers[viewer.id] = viewer
        try:
            answer = await viewer.answer(offer_sdp)
        except BaseException:
            await viewer.close()
            raise
        return viewer, answer

    async def _run_viewer_actions(self, actions: list[a.Action]) -> None:
        started = time.monotonic()
        await self._guest().post_json("/actions", a.action_batch_adapter.dump_json(actions))
        self.log_actions(actions, started, "viewer")

    def log_actions(self, actions: list[a.Action], started: float, source: ActionSource) -> None:
        """Log actions that started at `started` (`time.monotonic()`) into a recording."""
        if self.recorder is not None:
            self.recorder.log(actions, self.hub.clock_us(started), source)

    # --- control ---------------------------------------------------------------------------

    def take_control(self, viewer_id: str) -> ControlState:
        return self.control.take(viewer_id)

    def release_control(self, viewer_id: str) -> ControlState:
        return self.control.release(viewer_id)

    # --- recordings ------------------------------------------------------------------------

    def start_recording(self) -> RecordingInfo:
        """Start recording; if one is running already, that one."""
        if self.recorder is None:
            self.recorder = Recorder(self.hub, self._recordings_dir, self.id)
            self.recorder.start()
        return self.recorder.info()

    async def stop_recording(self) -> RecordingInfo:
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            raise Conflict(
                f"desktop {self.id} is not recording: start with POST .../recording/start"
            )
        return await recorder.stop()

    # --- state -----------------------------------------------------------------------------

    async def state(self) -> LiveState:
        controller = self.control.controller
        try:
            response = await self._guest().request("GET", "/frames/stats")
            encoder = _VIDEO_STATS.validate_json(response.content)
        except (NotFound, ValidationError):
            encoder = None
        return LiveState(
            desktop=self._manager.get(self.id),
            viewers=[
                ViewerInfo(
                    id=v.id,
                    transport=v.transport,
                    can_control=v.can_control,
                    controlling=v is controller,
                )
                for v in self.control.viewers.values()
            ],
            controller=controller.id if controller else None,
            stream=self.hub.stats(),
            encoder=encoder,
            mjpeg_watchers=self.jpeg.watchers,
            recording=self.recorder.info() if self.recorder else None,
        )

    async def close(self) -> None:
        """Hang up every viewer, finish the recording, stop reading; idempotent."""
        if self.recorder is not None:
            recorder, self.recorder = self.recorder, None
            await recorder.stop()
        await asyncio.gather(*(peer.close() for peer in list(self.peers.values())))
        await self.control.stop()
        await self.jpeg.stop()
        await self.hub.stop()


class LiveDesktops:
    """The live side of every desktop of one manager."""

    def __init__(self, manager: SandboxManager, recordings: Path) -> None:
        self.recordings = recordings
        """Directory with one folder of recordings per desktop."""
        self._manager = manager
        self._live: dict[str, LiveDesktop] = {}
        self._sweeper: asyncio.Task | None = None

    def start(self) -> None:
        if logging.getLogger("aioice").level == logging.NOTSET:
            # aioice tells every ICE check at INFO: a screenful per viewer.
            logging.getLogger("aioice").setLevel(logging.WARNING)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="sweep-live-desktops")

    async def stop(self) -> None:
        """Close everything live; idempotent."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            await asyncio.wait([sweeper])
        live, self._live = list(self._live.values()), {}
        await asyncio.gather(*(each.close() for each in live))

    def get(self, desktop_id: str) -> LiveDesktop:
        """The live side of a ready desktop; raises if it is unknown, starting or gone."""
        self._manager.guest(desktop_id)
        if desktop_id not in self._live:
            self._live[desktop_id] = LiveDesktop(desktop_id, self._manager, self.recordings)
        return self._live[desktop_id]

    def log_actions(
        self, desktop_id: str, actions: list[a.Action], started: float, source: ActionSource
    ) -> None:
        """Log actions run on a desktop into its recording, if one is running."""
        if (live := self._live.get(desktop_id)) is not None:
            live.log_actions(actions, started, source)

    # --- recordings on disk ----------------------------------------------------------------

    def _folder(self, desktop_id: str) -> Path:
        if not desktop_id.isalnum():
            raise DesktopNotFound(f"no desktop {desktop_id!r}: list them with GET /api/desktops")
        return self.recordings / desktop_id

    def recording_log(self, desktop_id: str, recording_id: str) -> ActionLog:
        """A recording's info and action log, while it runs or once it ended."""
        live = self._live.get(desktop_id)
        if live is not None and live.recorder is not None and live.recorder.id == recording_id:
            return live.recorder.action_log()
        path = self._folder(desktop_id) / f"{recording_id}.json"
        if not recording_id.isalnum() or not path.is_file():
            raise self._unknown(desktop_id, recording_id)
        return read_log(path)

    def recording_video(self, desktop_id: str, recording_id: str) -> Path:
        """The MP4 file of a finished recording."""
        entry = self.recording_log(desktop_id, recording_id).recording
        if entry.status == "recording":
            raise Conflict(f"recording {recording_id} is still running: stop it first")
        path = self._folder(desktop_id) / f"{recording_id}.mp4"
        if not path.is_file():
            raise RecordingNotFound(
                f"recording {recording_id} has no video: {entry.reason or 'it failed'}"
            )
        return path

    def list_recordings(self, desktop_id: str) -> list[RecordingInfo]:
        folder = self._folder(desktop_id)
        found = {path.stem: read_log(path).recording for path in sorted(folder.glob("*.json"))}
        if (live := self._live.get(desktop_id)) is not None and live.recorder is not None:
            found[live.recorder.id] = live.recorder.info()
        if not found:
            self._manager.get(desktop_id)  # an unknown desktop is a 404, a known one an empty list
        return sorted(found.values(), key=lambda info: info.started_at)

    def _unknown(self, desktop_id: str, recording_id: str) -> RecordingNotFound:
        return RecordingNotFound(
            f"desktop {desktop_id} has no recording {recording_id!r}: "
            f"list them with GET /api/desktops/{desktop_id}/recordings"
        )

    # --- housekeeping ----------------------------------------------------------------------

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            for desktop_id, live in list(self._live.items()):
                try:
                    status = self._manager.get(desktop_id).status
                except DesktopNotFound:
                    status = "stopped"
                if status != "ready":
                    log.info("desktop %s is %s: closing its live view", desktop_id, status)
                    self._live.pop(desktop_id, None)
                    try:
                        await live.close()
                    except Exception:  # one desktop's failure must not end the sweeping
                        log.exception("closing the live view of desktop %s failed", desktop_id)
                elif live.in_use:
                    self._manager.guest(desktop_id)  # watching counts as using
