"""Recordings a killed service left behind, finished at the next start.

A recording writes fragmented MP4 to `<id>.mp4.part` and saves its `ActionLog` about once
a second (`cubicle.server.live.recording`). When the service dies mid-recording, both stay as they
were; `recover_interrupted` turns each such `.part` that plays into its `.mp4`, with the
log's recording marked `interrupted` (or `failed` when nothing of the video can be read).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import av

from cubicle.protocol.service import ActionLog, RecordingInfo
from cubicle.server.live.recording import read_log

INTERRUPTED = "the service stopped while recording: the video ends at its last second written"


def recover_interrupted(root: Path) -> list[RecordingInfo]:
    """Finish the recordings a killed service left under `root` (one folder per desktop):
    each `.mp4.part` that plays becomes its `.mp4`, `interrupted`; blocking, use a thread."""
    recovered = []
    for part in sorted(root.glob("*/*.mp4.part")):
        recording_id = part.name.removesuffix(".mp4.part")
        log_path = part.with_name(f"{recording_id}.json")
        try:
            log = read_log(log_path)
        except (OSError, ValueError):
            started = datetime.fromtimestamp(part.stat().st_ctime, UTC)
            info = RecordingInfo(
                id=recording_id, desktop_id=part.parent.name, status="recording", started_at=started
            )
            log = ActionLog(recording=info, actions=[])
        info = log.recording.model_copy(
            update={"stopped_at": datetime.fromtimestamp(part.stat().st_mtime, UTC)}
        )
        try:
            with av.open(str(part)) as container:
                stream = container.streams.video[0]
                frames = sum(1 for packet in container.demux(stream) if packet.size)
                duration = stream.duration and float(stream.duration * stream.time_base)
                info.width, info.height = stream.width, stream.height
        except (av.FFmpegError, IndexError, OSError) as exc:
            frames, duration = 0, None
            info.reason = f"{INTERRUPTED}; nothing of the video could be read ({exc})"
        if frames:
            video = part.with_name(f"{recording_id}.mp4")
            part.rename(video)
            info.status, info.reason, info.frames = "interrupted", INTERRUPTED, frames
            info.bytes = video.stat().st_size
            info.duration_ms = duration * 1000 if duration else None
        else:
            info.status = "failed"
            part.unlink(missing_ok=True)
        finished = ActionLog(recording=info, actions=log.actions)
        log_path.write_text(finished.model_dump_json(indent=1))
        recovered.append(info)
    return recovered
