"""`/api/snapshots`: desktops saved by name (`POST /api/desktops/{id}/snapshot`), to start
copies from (`POST /api/desktops {"snapshot": name}`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from cubicle.protocol.service import SnapshotInfo
from cubicle.server.api.deps import ManagerDep

router = APIRouter(prefix="/api/snapshots", tags=["snapshots"])


@router.get("")
async def list_snapshots(manager: ManagerDep) -> list[SnapshotInfo]:
    """Every named snapshot: its runtime, parent, size, and whether it keeps memory."""
    return manager.snapshots()


@router.delete("/{name}", status_code=204)
async def delete_snapshot(name: str, manager: ManagerDep) -> Response:
    """Delete a snapshot; desktops started from it go on (microvm: refused while any runs)."""
    await manager.delete_snapshot(name)
    return Response(status_code=204)
