"""`/api/volumes`: named file systems desktops mount (`"volumes"` at create), and their
files without a desktop (`cubicle.server.volumes`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request, Response

from cubicle.protocol.models import NO_NUL
from cubicle.protocol.service import CreateVolume, VolumeInfo
from cubicle.server.api.deps import ManagerDep, SettingsDep
from cubicle.server.api.desktops import UPLOAD_BODY

router = APIRouter(prefix="/api/volumes", tags=["volumes"])


@router.post("", status_code=201)
async def create_volume(body: CreateVolume, manager: ManagerDep) -> VolumeInfo:
    """A volume of `size_mb` (its quota): mount it at create with
    `"volumes": {"/mnt/data": name}` (or `{"volume": name, "read_only": true}`)."""
    return await asyncio.to_thread(manager.volumes.create, body)


@router.get("")
async def list_volumes(manager: ManagerDep) -> list[VolumeInfo]:
    """Every volume, its size, what it takes on the host, and the desktops using it."""
    return await asyncio.to_thread(manager.volumes.all)


@router.get("/{name}")
async def get_volume(name: str, manager: ManagerDep) -> VolumeInfo:
    return await asyncio.to_thread(manager.volumes.get, name)


@router.delete("/{name}", status_code=204)
async def delete_volume(name: str, manager: ManagerDep) -> Response:
    """Delete a volume and its files; 409 while a desktop uses it."""
    await asyncio.to_thread(manager.volumes.delete, name)
    return Response(status_code=204)


@router.get("/{name}/files", response_class=Response)
async def read_volume_file(
    name: str,
    manager: ManagerDep,
    settings: SettingsDep,
    path: str = Query(min_length=1, max_length=4096, pattern=NO_NUL),
) -> Response:
    """A file of the volume, without a desktop (409 while a desktop writes the volume);
    links are never followed."""
    data = await asyncio.to_thread(manager.volumes.read, name, path, settings.max_upload_bytes)
    return Response(data, media_type="application/octet-stream")


@router.put("/{name}/files", status_code=204, openapi_extra=UPLOAD_BODY)
async def write_volume_file(
    name: str,
    request: Request,
    manager: ManagerDep,
    path: str = Query(min_length=1, max_length=4096, pattern=NO_NUL),
) -> Response:
    """Write a file of the volume (its folders made), without a desktop; 409 while a
    desktop writes the volume, 507 past its quota."""
    data = await request.body()
    await asyncio.to_thread(manager.volumes.write, name, path, data)
    return Response(status_code=204)
