"""Everything live about each desktop: its hub, viewers, control, MJPEG feed and recordings.

`LiveDesktops` is what the live view's room (`cubicle.server.live.api.LiveRoom`) runs: started with
the service, it listens to the manager's events, makes a `LiveDesktop` the first time
a desktop is watched, recorded or driven, logs every action that runs on a desktop into
its recording, and closes a desktop's live side (viewers hung up, recording finished,
reader stopped) as soon as the manager says the desktop ended or was parked (paused with its
programs stopped: the viewers' page waits and opens a new view once it is resumed). A
recording, or a person in
control, keeps a desktop alive past its idle timeout; a view-only watcher does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, TypeAdapter, ValidationError

from cubicle.guest.video.source import VideoStats
from cubicle.protocol import actions as a
from cubicle.protocol.errors import Conflict, DesktopNotFound, NotFound, RecordingNotFound
from cubicle.protocol.routes import GuestPath
from cubicle.protocol.service import ActionLog, DesktopInfo, RecordingInfo
from cubicle.server.events import (
    ActionsRan,
    DesktopEnded,
    DesktopEvent,
    DesktopParked,
    LinkRevoked,
)
from cubicle.server.live.control import Control, ControlState, Transport, Viewer
from cubicle.server.live.guest_source import GuestFrames
from cubicle.server.live.hub import FrameHub, HubStats
from cubicle.server.live.mjpeg import JpegFeed
from cubicle.server.live.overlay import Marker, OverlayMessage
from cubicle.server.live.recording import Recorder, read_log
from cubicle.server.live.recovery import recover_interrupted
from cubicle.server.live.webrtc import WebRtcViewer
from cubicle.server.manager import SandboxManager
from cubicle.server.services import Services

log = logging.getLogger("cubicle.streaming")

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

    def __init__(
        self,
        desktop_id: str,
        manager: SandboxManager,
        recordings: Path,
        finishing: dict[str, Recorder],
    ) -> None:
        self.id = desktop_id
        self._manager = manager
        self._recordings_dir = recordings / desktop_id
        self._finishing = finishing
        """The service's recordings being finished, by id (`LiveDesktops.finishing`)."""

        def guest():  # watching is not using: a view-only watcher keeps nothing alive
            return manager.guest(desktop_id, touch=False)

        self.hub = FrameHub(GuestFrames(guest), name=f"video-{desktop_id}")
        self.jpeg = JpegFeed(guest, name=f"mjpeg-{desktop_id}")
        self.control = Control(
            self._run_viewer_actions,
            name=f"control-{desktop_id}",
            on_hand_over=self._on_hand_over,
        )
        self.peers: dict[str, WebRtcViewer] = {}
        self.recorder: Recorder | None = None
        """The recording running now; finished ones are files."""
        self.marker = Marker()
        """Turns the actions that run here into the overlay's marks."""
        self._guest = guest
        self._by_link: dict[str, list[Callable[[], object]]] = {}
        """What to close when a share link is revoked: the viewers it opened."""

    def on_revoke(self, link_id: str | None, close: Callable[[], object]) -> None:
        """Call `close` (plain or a coroutine function) if share link `link_id` is revoked."""
        if link_id is not None:
            self._by_link.setdefault(link_id, []).append(close)

    async def revoke(self, link_id: str) -> None:
        """Hang up everything share link `link_id` opened."""
        for close in self._by_link.pop(link_id, []):
            if asyncio.iscoroutine(done := close()):
                await done

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
        await self._manager.run_actions(self.id, actions, source="viewer")

    def log_actions(self, event: ActionsRan) -> None:
        """Log a batch that ran on this desktop into its recording, if one runs, and show
        its marks to the viewers (and to a recording that burns them in)."""
        marks = self.marker.marks(event.actions)
        overlay = OverlayMessage(source=event.source, marks=marks) if marks else None
        if self.recorder is not None:
            at_us = self.hub.clock_us(event.started)
            self.recorder.log(list(event.actions), at_us, event.source, overlay)
        if overlay is not None:
            self.control.tell_all(overlay)

    # --- control ---------------------------------------------------------------------------

    def take_control(self, viewer_id: str) -> ControlState:
        return self.control.take(viewer_id)

    def release_control(self, viewer_id: str) -> ControlState:
        return self.control.release(viewer_id)

    def _on_hand_over(self, controller: Viewer | None) -> None:
        """A person in control keeps the desktop alive: the agent may be paused for them."""
        if controller is not None:
            self._manager.hold(self.id, self.control)
        else:
            self._manager.release(self.id, self.control)

    # --- recordings ------------------------------------------------------------------------

    def start_recording(self, *, overlay: bool = False) -> RecordingInfo:
        """Start recording (with the actions drawn in, if `overlay`); if one is running
        already, that one."""
        if self.recorder is None:
            self._manager.hold(self.id, self)
            self.recorder = Recorder(self.hub, self._recordings_dir, self.id, overlay=overlay)
            self.recorder.start()
        return self.recorder.info()

    async def stop_recording(self) -> RecordingInfo:
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            raise Conflict(
                f"desktop {self.id} is not recording: start with POST .../recording/start"
            )
        self._manager.release(self.id, self)
        return await self._finish(recorder)

    async def _finish(self, recorder: Recorder) -> RecordingInfo:
        """Finish a recording that no longer records; until its file and log are written,
        its log is read from it (it is on no list of this desktop any more)."""
        self._finishing[recorder.id] = recorder
        try:
            return await recorder.stop()
        finally:
            self._finishing.pop(recorder.id, None)

    # --- state -----------------------------------------------------------------------------

    async def state(self) -> LiveState:
        controller = self.control.controller
        try:
            answer = await self._guest().request("GET", GuestPath.FRAMES_STATS)
            encoder = _VIDEO_STATS.validate_json(answer.content)
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
            await self._finish(recorder)
        self._manager.release(self.id, self)
        self._manager.release(self.id, self.control)
        await asyncio.gather(*(peer.close() for peer in list(self.peers.values())))
        await self.control.stop()
        await self.jpeg.stop()
        await self.hub.stop()


class LiveDesktops:
    """The live side of every desktop of one service (run by `cubicle.server.live.api.LiveRoom`)."""

    def __init__(self) -> None:
        self._manager: SandboxManager | None = None
        self.recordings = Path()
        """Directory with one folder of recordings per desktop (set at start)."""
        self._live: dict[str, LiveDesktop] = {}
        self.finishing: dict[str, Recorder] = {}
        """Recordings stopped but not yet written out, by id: a desktop that ended is no
        longer live, and its last recording's log is still read from the recorder."""
        self._closing: set[asyncio.Task[None]] = set()
        self._unsubscribe: Callable[[], None] | None = None

    async def start(self, services: Services) -> None:
        if logging.getLogger("aioice").level == logging.NOTSET:
            # aioice tells every ICE check at INFO: a screenful per viewer.
            logging.getLogger("aioice").setLevel(logging.WARNING)
        self._manager = services.manager
        self.recordings = services.settings.data_dir / "recordings"
        for info in await asyncio.to_thread(recover_interrupted, self.recordings):
            log.warning("recording %s of desktop %s: %s", info.id, info.desktop_id, info.reason)
        self._unsubscribe = services.manager.events.subscribe(self._on_event)
        services.add(self)

    async def stop(self) -> None:
        """Close everything live, and wait for what is still closing; idempotent."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        live, self._live = list(self._live.values()), {}
        await asyncio.gather(*(each.close() for each in live))
        while self._closing:
            await asyncio.wait(set(self._closing))

    @property
    def manager(self) -> SandboxManager:
        if self._manager is None:
            raise RuntimeError("the live view has not started")
        return self._manager

    async def woken(self, desktop_id: str) -> LiveDesktop:
        """`get`, once a paused desktop that resumes on use (`auto_resume`) is resumed: a
        new viewer is a use."""
        await self.manager.awake(desktop_id, touch=False)
        return self.get(desktop_id)

    def get(self, desktop_id: str) -> LiveDesktop:
        """The live side of a ready desktop; raises if it is unknown, starting or gone."""
        self.manager.guest(desktop_id, touch=False)
        if desktop_id not in self._live:
            self._live[desktop_id] = LiveDesktop(
                desktop_id, self.manager, self.recordings, self.finishing
            )
        return self._live[desktop_id]

    def _on_event(self, event: DesktopEvent) -> None:
        match event:
            case ActionsRan(desktop_id=desktop_id):
                if (live := self._live.get(desktop_id)) is not None:
                    live.log_actions(event)
            case LinkRevoked(desktop_id=desktop_id, link_id=link_id):
                if (live := self._live.get(desktop_id)) is not None:
                    self._own(live.revoke(link_id), f"revoke-{link_id}")
            case DesktopEnded(desktop_id=desktop_id) | DesktopParked(desktop_id=desktop_id):
                if (live := self._live.pop(desktop_id, None)) is not None:
                    how = "parked" if isinstance(event, DesktopParked) else event.status
                    log.info("desktop %s is %s: closing its live view", desktop_id, how)
                    if live.recorder is not None:  # readable from now, not once `close` runs
                        self.finishing[live.recorder.id] = live.recorder
                    self._own(self._close(live), f"close-live-{desktop_id}")

    def _own(self, work, name: str) -> None:
        """Run `work` as a task `stop()` waits for."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(live: LiveDesktop) -> None:
        try:
            await live.close()
        except Exception:  # one desktop's failure must not leave the others unclosed
            log.exception("closing the live view of desktop %s failed", live.id)

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
        finishing = self.finishing.get(recording_id)
        if finishing is not None and finishing.desktop_id == desktop_id:
            return finishing.action_log()
        path = self._folder(desktop_id) / f"{recording_id}.json"
        if not recording_id.isalnum() or not path.is_file():
            raise self._unknown(desktop_id, recording_id)
        return read_log(path)

    def recording_video(self, desktop_id: str, recording_id: str) -> Path:
        """The MP4 file of a finished recording."""
        entry = self.recording_log(desktop_id, recording_id).recording
        if recording_id in self.finishing:
            raise Conflict(f"recording {recording_id} is being written out: try again shortly")
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
        for recorder in self.finishing.values():
            if recorder.desktop_id == desktop_id:
                found[recorder.id] = recorder.info()
        if (live := self._live.get(desktop_id)) is not None and live.recorder is not None:
            found[live.recorder.id] = live.recorder.info()
        if not found:
            self.manager.get(desktop_id)  # an unknown desktop is a 404, a known one an empty list
        return sorted(found.values(), key=lambda info: info.started_at)

    def _unknown(self, desktop_id: str, recording_id: str) -> RecordingNotFound:
        return RecordingNotFound(
            f"desktop {desktop_id} has no recording {recording_id!r}: "
            f"list them with GET /api/desktops/{desktop_id}/recordings"
        )
