"""`/api/secrets`: values desktops use without holding them (`cubicle.server.outbound`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from cubicle.protocol.service import CreateSecret, SecretInfo
from cubicle.server.api.deps import ManagerDep

router = APIRouter(prefix="/api/secrets", tags=["secrets"])


@router.post("", status_code=201)
async def create_secret(body: CreateSecret, manager: ManagerDep) -> SecretInfo:
    """Keep a secret, encrypted: desktops created with `"secrets": [name]` see only its
    placeholder, and the egress proxy puts the value in their requests to `hosts`."""
    return manager.outbound.secrets.create(body)


@router.get("")
async def list_secrets(manager: ManagerDep) -> list[SecretInfo]:
    """Every secret, without its value (no route returns a value)."""
    return manager.outbound.secrets.list()


@router.get("/{name}")
async def get_secret(name: str, manager: ManagerDep) -> SecretInfo:
    return manager.outbound.secrets.get(name).info()


@router.delete("/{name}", status_code=204)
async def delete_secret(name: str, manager: ManagerDep) -> Response:
    """Delete a secret: from the next request on, no desktop's placeholder stands for it."""
    manager.outbound.secrets.delete(name)
    return Response(status_code=204)
