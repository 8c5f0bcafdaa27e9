"""Runs on disk: `<data_dir>/runs/<run_id>/run.json`, `step-NNN.json` and `step-NNN.png`.

Every file is written atomically (a temporary file renamed over the old one), so a reader
never sees half a record. The file work runs in a thread; the async methods are what the
loop and the API call.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import secrets
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from PIL import Image, ImageDraw

from cubicle.agent.steps import Grounded, RunDetail, RunRecord, StepRecord
from cubicle.protocol.errors import InvalidRequest, NotFound

_RUN_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")
_MARK = (255, 0, 64)
"""Colour of the grounded points drawn on saved screenshots."""
_MARK_RADIUS = 14
"""Radius of the circle around a grounded point, screen pixels."""


class RunNotFound(NotFound):
    """No run with this id in the data directory."""

    code = "run_not_found"


def new_run_id() -> str:
    """A new run id, sortable by start time: `20261121-235012-a1b2c3` (UTC)."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def step_name(index: int) -> str:
    """`step-007` for step 7."""
    return f"step-{index:03d}"


def _write_atomic(path: Path, data: bytes) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def draw_points(screenshot: Image.Image, grounded: Sequence[Grounded]) -> Image.Image:
    """A copy of `screenshot` (a full-size screen image) with each grounded point marked:
    a ring and a cross at the point, the element's box outlined when known."""
    marked = screenshot.convert("RGB")
    draw = ImageDraw.Draw(marked)
    for point in grounded:
        if point.box is not None:
            draw.rectangle(point.box, outline=_MARK, width=2)
        x, y, r = point.x, point.y, _MARK_RADIUS
        draw.ellipse((x - r, y - r, x + r, y + r), outline=_MARK, width=3)
        draw.line((x - r - 6, y, x + r + 6, y), fill=_MARK, width=1)
        draw.line((x, y - r - 6, x, y + r + 6), fill=_MARK, width=1)
    return marked


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


class RunStore:
    """The runs kept under `data_dir/runs`. Cheap to build: it opens nothing."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "runs"

    def run_dir(self, run_id: str) -> Path:
        """The directory of run `run_id`; `InvalidRequest` for an id that is not one."""
        if not _RUN_ID.fullmatch(run_id):
            raise InvalidRequest(
                f"{run_id!r} is not a run id (they look like 20261121-235012-a1b2c3)"
            )
        return self.root / run_id

    # --- writing --------------------------------------------------------------------------

    def _make_dir(self, directory: Path) -> None:
        """The run's directory, and `runs/` above it: owner-only whatever the caller's
        umask (a run holds screenshots of the desktop; files are 0600 from mkstemp)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)

    async def save_run(self, record: RunRecord) -> None:
        """Write (or rewrite) the run's `run.json`."""
        directory = self.run_dir(record.id)

        def write() -> None:
            self._make_dir(directory)
            _write_atomic(directory / "run.json", record.model_dump_json(indent=2).encode())

        await asyncio.to_thread(write)

    async def save_step(self, step: StepRecord, screenshot: Image.Image | None) -> None:
        """Write the step's record and its screenshot with the grounded points drawn on it
        (`screenshot` is the full-size screen the step saw; None when it has none)."""
        directory = self.run_dir(step.run_id)
        name = step_name(step.index)

        def write() -> None:
            self._make_dir(directory)
            if screenshot is not None:
                _write_atomic(
                    directory / f"{name}.png", _png(draw_points(screenshot, step.grounded))
                )
            _write_atomic(directory / f"{name}.json", step.model_dump_json(indent=2).encode())

        await asyncio.to_thread(write)

    # --- reading --------------------------------------------------------------------------

    async def list_runs(self) -> list[RunRecord]:
        """Every run, newest first."""

        def read() -> list[RunRecord]:
            if not self.root.is_dir():
                return []
            found = []
            for path in sorted(self.root.glob("*/run.json"), reverse=True):
                if _RUN_ID.fullmatch(path.parent.name):
                    found.append(RunRecord.model_validate_json(path.read_bytes()))
            return found

        return await asyncio.to_thread(read)

    async def get_run(self, run_id: str) -> RunDetail:
        """A run and its steps in order; `RunNotFound` when there is no such run."""
        directory = self.run_dir(run_id)

        def read() -> RunDetail:
            try:
                run = RunRecord.model_validate_json((directory / "run.json").read_bytes())
            except FileNotFoundError:
                raise RunNotFound(f"no run {run_id} in {self.root}") from None
            steps = [
                StepRecord.model_validate_json(path.read_bytes())
                for path in sorted(directory.glob("step-[0-9][0-9][0-9].json"))
            ]
            return RunDetail(run=run, steps=steps)

        return await asyncio.to_thread(read)

    def step_image(self, run_id: str, index: int) -> Path:
        """The PNG of step `index` of run `run_id`; `NotFound` when it does not exist."""
        path = self.run_dir(run_id) / f"{step_name(index)}.png"
        if not path.is_file():
            if not (path.parent / "run.json").is_file():
                raise RunNotFound(f"no run {run_id} in {self.root}")
            raise NotFound(f"run {run_id} has no screenshot for step {index}")
        return path
