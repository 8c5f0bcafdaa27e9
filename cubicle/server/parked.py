"""Parked desktops, written down so that a later service finds them again.

A parked desktop is what its runtime kept of it (`Sandbox.park`: a local desktop's disk
image `parked/<id>.img`; a microVM's directory `parked/<id>.vm/`, its disk layer and, when
parked with memory, its RAM) plus what the service knew of it: this module writes that
beside it as `parked/<id>.json` and reads every such pair back when a service starts, so a
desktop paused before a restart is listed, paused, and resumable after it. A record whose
kept files are gone is dropped with a warning; one that cannot be read is left alone and
logged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cubicle.protocol.service import Lifecycle
from cubicle.server.runtime import SandboxSpec

log = logging.getLogger("cubicle.parked")


@dataclass(frozen=True)
class Parked:
    """What a later service needs to list and resume a desktop paused without memory."""

    spec: SandboxSpec
    runtime: str
    timeout_s: int
    created_at: datetime
    paused_at: datetime
    lifecycle: Lifecycle
    disk: Path
    """What its runtime kept (`SandboxSpec.disk_image` on resume)."""
    memory: bool = False
    """Its memory was kept as well: its programs run on when it resumes."""

    def save(self) -> None:
        """Write it beside its disk image, whole or not at all."""
        spec = dataclasses.asdict(self.spec)
        spec["disk_image"] = None
        spec["trust_pem"] = None  # a desktop with secrets is never parked across restarts
        document = {
            "spec": spec,
            "runtime": self.runtime,
            "timeout_s": self.timeout_s,
            "created_at": self.created_at.isoformat(),
            "paused_at": self.paused_at.isoformat(),
            "lifecycle": self.lifecycle.model_dump(),
            "memory": self.memory,
        }
        path = record_path(self.disk)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(document))
        os.chmod(partial, 0o600)
        partial.replace(path)


def record_path(disk: Path) -> Path:
    return disk.with_suffix(".json")


KEPT_SUFFIXES = (".img", ".vm")
"""What runtimes keep: a disk image (local), a directory (microVM)."""


def forget(disk: Path) -> None:
    """Delete a parked desktop's record and what its runtime kept."""
    record_path(disk).unlink(missing_ok=True)
    if disk.is_dir():
        for path in disk.iterdir():  # sealed read-only by some runtimes
            path.chmod(0o600)
        shutil.rmtree(disk, ignore_errors=True)
    else:
        disk.unlink(missing_ok=True)


def load_all(directory: Path) -> list[Parked]:
    """Every desktop parked in `directory` whose disk image is still there."""
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        kept = [path.with_suffix(suffix) for suffix in KEPT_SUFFIXES]
        disk = next((p for p in kept if p.exists()), None)
        if disk is None:
            log.warning("parked desktop %s has no disk any more: dropped", path.stem)
            path.unlink(missing_ok=True)
            continue
        try:
            document = json.loads(path.read_text())
            spec = document["spec"]
            for name in ("node_labels", "env", "hosts"):
                spec[name] = tuple(tuple(pair) for pair in spec[name])
            found.append(
                Parked(
                    spec=SandboxSpec(**spec),
                    runtime=str(document["runtime"]),
                    timeout_s=int(document["timeout_s"]),
                    created_at=datetime.fromisoformat(document["created_at"]),
                    paused_at=datetime.fromisoformat(document["paused_at"]),
                    lifecycle=Lifecycle.model_validate(document["lifecycle"]),
                    disk=disk,
                    memory=bool(document.get("memory", False)),
                )
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("parked desktop %s cannot be read (%s): left as it is", path.stem, exc)
    return found
