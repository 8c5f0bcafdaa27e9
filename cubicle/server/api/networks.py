"""`/api/networks`: private networks desktops join at create (`cubicle.server.networks`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from cubicle.protocol.service import CreateNetwork, NetworkInfo
from cubicle.server.api.deps import ManagerDep

router = APIRouter(prefix="/api/networks", tags=["networks"])


@router.post("", status_code=201)
async def create_network(body: CreateNetwork, manager: ManagerDep) -> NetworkInfo:
    """A private network: desktops created with `"networks": [name]` reach each other by
    id or alias on every port, and nothing else through it."""
    return await manager.networks.create(body.name)


@router.get("")
async def list_networks(manager: ManagerDep) -> list[NetworkInfo]:
    return manager.networks.infos()


@router.get("/{name}")
async def get_network(name: str, manager: ManagerDep) -> NetworkInfo:
    return manager.networks.info(name)


@router.delete("/{name}", status_code=204)
async def delete_network(name: str, manager: ManagerDep) -> Response:
    """Delete a network no desktop is on (409 while some are)."""
    await manager.networks.delete(name)
    return Response(status_code=204)
