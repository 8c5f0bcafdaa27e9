"""`/api/desktops/{id}/...` for the live view: WebRTC signalling, MJPEG, input, control,
recordings and share links; and `LiveRoom`, which mounts them on the service.

Every route here takes the admin token or a share token scoped to the desktop in the path
(`view` or `control`), so a shared link opens one desktop's viewer and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Receive, Scope, Send

from cubicle.protocol.errors import CubicleError, status_for
from cubicle.protocol.service import AccessMode, ActionLog, RecordingInfo, ShareLink
from cubicle.server.api.auth import (
    AdminAccess,
    ControlAccess,
    ViewAccess,
    access_of,
    check_access,
)
from cubicle.server.live.control import ControlState, Viewer
from cubicle.server.live.live import LiveDesktops, LiveState
from cubicle.server.live.mjpeg import MEDIA_TYPE
from cubicle.server.services import Services, services_of

router = APIRouter(prefix="/api/desktops", tags=["live view"])


async def get_live(request: Request) -> LiveDesktops:
    return services_of(request).get(LiveDesktops)


LiveDep = Annotated[LiveDesktops, Depends(get_live)]


class Offer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["offer"] = "offer"
    sdp: str = Field(min_length=1, max_length=200_000)
    """The browser's `RTCPeerConnection.createOffer()` SDP, candidates included."""


class Answer(BaseModel):
    type: Literal["answer"] = "answer"
    sdp: str
    viewer_id: str
    """This viewer's id, for `POST .../control`."""


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    viewer_id: str = Field(min_length=1, max_length=64)
    take: bool
    """True takes control (from whoever has it); False gives it back."""


class ShareRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: AccessMode = "view"
    """`view` watches only; `control` may also take control."""
    ttl_s: Annotated[int, Field(ge=60, le=30 * 86_400)] = 86_400
    """Seconds the link works."""


@router.post("/{desktop_id}/webrtc")
async def webrtc_offer(desktop_id: str, body: Offer, access: ViewAccess, live: LiveDep) -> Answer:
    """Open a WebRTC view: post the browser's offer, get the answer and a viewer id.

    The offer needs a receive-only video section (H.264, packetization-mode 1) and may carry
    a data channel, which then takes the viewer's input and reports who controls.
    """
    desktop = await live.woken(desktop_id)
    viewer, sdp = await desktop.add_webrtc_viewer(body.sdp, can_control=access.mode == "control")
    desktop.on_revoke(access.link_id, viewer.close)
    return Answer(sdp=sdp, viewer_id=viewer.id)


class _ClosingStream(StreamingResponse):
    """A streamed body whose generator is closed however the response ends."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


@router.get("/{desktop_id}/mjpeg", response_class=StreamingResponse)
async def mjpeg(desktop_id: str, access: ViewAccess, live: LiveDep) -> StreamingResponse:
    """The fallback view: the screen as MJPEG (`multipart/x-mixed-replace`), for an `<img>`."""
    desktop = await live.woken(desktop_id)
    revoked = asyncio.Event()
    desktop.on_revoke(access.link_id, revoked.set)
    return _ClosingStream(
        _until(revoked, desktop.jpeg.watch()),
        media_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-store"},
    )


async def _until(stop: asyncio.Event, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`frames` until `stop` is set (a revoked share link ends its stream at once)."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while True:
            following = asyncio.ensure_future(anext(frames))
            await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
                return
            try:
                yield following.result()
            except StopAsyncIteration:
                return
    finally:
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
        await frames.aclose()  # type: ignore[attr-defined]


class _SocketOut:
    """Messages to a WebSocket viewer, written in order by one task; a full queue drops."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=256)

    def send_text(self, text: str, *, droppable: bool = False) -> None:
        if self._queue.qsize() < (self._queue.maxsize // 2 if droppable else self._queue.maxsize):
            self._queue.put_nowait(text)

    def close(self) -> None:
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def run(self, websocket: WebSocket) -> None:
        try:
            while (text := await self._queue.get()) is not None:
                await websocket.send_text(text)
            await websocket.close(code=1001, reason="the desktop is gone")
        except (WebSocketDisconnect, RuntimeError):
            pass  # the page left first


@router.websocket("/{desktop_id}/input")
async def input_socket(websocket: WebSocket, desktop_id: str) -> None:
    """The fallback's input and control messages (WebRTC viewers use their data channel).

    The first message says who controls and carries this viewer's id. Auth problems close
    the socket with code 4000 + the HTTP status (4401, 4403, 4404) and the reason.
    """
    await websocket.accept()
    try:
        access = access_of(websocket, desktop_id)
        check_access(access, desktop_id, "view")
        live = await services_of(websocket).get(LiveDesktops).woken(desktop_id)
    except CubicleError as exc:
        await websocket.close(code=4000 + status_for(exc), reason=exc.message[:120])
        return
    out = _SocketOut()
    viewer = Viewer(out, "mjpeg", can_control=access.mode == "control")
    writer = asyncio.create_task(out.run(websocket), name=f"ws-{viewer.id}")
    live.on_revoke(access.link_id, out.close)
    live.control.join(viewer)
    try:
        while True:
            live.control.handle(viewer, await websocket.receive_text())
    except WebSocketDisconnect:
        pass
    finally:
        live.control.leave(viewer)
        writer.cancel()
        await asyncio.wait([writer])


@router.post("/{desktop_id}/control")
async def control(
    desktop_id: str, body: ControlRequest, access: ControlAccess, live: LiveDep
) -> ControlState:
    """Take control for a viewer (from whoever had it) or give it back."""
    desktop = live.get(desktop_id)
    if body.take:
        return desktop.take_control(body.viewer_id)
    return desktop.release_control(body.viewer_id)


@router.get("/{desktop_id}/live")
async def live_state(desktop_id: str, access: ViewAccess, live: LiveDep) -> LiveState:
    """Who watches, who controls, the stream's figures and the running recording."""
    return await live.get(desktop_id).state()


class RecordingOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overlay: bool = False
    """Draw the actions into the video (click ripples, drag paths, scroll marks, captions of
    typed text and keys), so the MP4 shows them anywhere. Costs a decode and an encode per
    frame for this recording; the live stream is not touched."""


@router.post("/{desktop_id}/recording/start")
async def start_recording(
    desktop_id: str, access: ControlAccess, live: LiveDep, body: RecordingOptions | None = None
) -> RecordingInfo:
    """Start recording the screen to MP4 (or get the recording already running)."""
    return live.get(desktop_id).start_recording(overlay=(body or RecordingOptions()).overlay)


@router.post("/{desktop_id}/recording/stop")
async def stop_recording(desktop_id: str, access: ControlAccess, live: LiveDep) -> RecordingInfo:
    """Stop the running recording and finish its file and action log."""
    return await live.get(desktop_id).stop_recording()


@router.get("/{desktop_id}/recordings")
async def list_recordings(
    desktop_id: str, access: ViewAccess, live: LiveDep
) -> list[RecordingInfo]:
    return live.list_recordings(desktop_id)


@router.get("/{desktop_id}/recordings/{recording_id}.mp4", response_class=FileResponse)
async def recording_video(
    desktop_id: str, recording_id: str, access: ViewAccess, live: LiveDep
) -> FileResponse:
    """The MP4 of a finished recording."""
    path = live.recording_video(desktop_id, recording_id)
    return FileResponse(path, media_type="video/mp4", filename=f"{desktop_id}-{recording_id}.mp4")


@router.get("/{desktop_id}/recordings/{recording_id}/actions")
async def recording_actions(
    desktop_id: str, recording_id: str, access: ViewAccess, live: LiveDep
) -> ActionLog:
    """The actions run during a recording, each with its offset (ms) into the video."""
    return live.recording_log(desktop_id, recording_id)


@router.post("/{desktop_id}/share")
async def share(
    desktop_id: str,
    request: Request,
    access: AdminAccess,
    live: LiveDep,
    body: ShareRequest | None = None,
) -> ShareLink:
    """A link to this desktop's viewer that can watch (`view`) or also take control.

    The answer is the only time the token is shown; the link's `id` lists and revokes it.
    """
    live.get(desktop_id)
    body = body or ShareRequest()
    shares = services_of(request).shares
    return shares.create(desktop_id, body.mode, body.ttl_s, _base_url(request))


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


@router.get("/{desktop_id}/shares")
async def list_shares(
    desktop_id: str, request: Request, access: AdminAccess, live: LiveDep
) -> list[ShareLink]:
    """The desktop's share links that still work (ids, modes, expiry; not their tokens)."""
    live.manager.get(desktop_id)
    shares = services_of(request).shares
    return [shares.describe(grant, _base_url(request)) for grant in shares.list(desktop_id)]


@router.delete("/{desktop_id}/shares/{link_id}", status_code=204)
async def revoke_share(
    desktop_id: str, link_id: str, request: Request, access: AdminAccess
) -> Response:
    """Revoke a share link: later requests with it answer 401, and the viewers it opened
    are hung up at once."""
    services_of(request).shares.revoke(desktop_id, link_id)
    return Response(status_code=204)


class LiveRoom:
    """The live view as a room of the service (`cubicle.server.services.Room`)."""

    routers = (router,)
    body_limits: dict[tuple[str, str], int] = {}  # noqa: RUF012 (read only)

    def __init__(self) -> None:
        self.desktops = LiveDesktops()

    async def start(self, services: Services) -> None:
        await self.desktops.start(services)

    async def stop(self) -> None:
        await self.desktops.stop()
