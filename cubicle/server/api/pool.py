"""`/api/pool`: the warm pool's spare desktops, how many it keeps and why."""

from __future__ import annotations

from fastapi import APIRouter

from cubicle.protocol.service import PoolInfo
from cubicle.server.api.deps import ManagerDep

router = APIRouter(prefix="/api/pool", tags=["desktops"])


@router.get("")
async def pool_info(manager: ManagerDep) -> PoolInfo:
    """Spares kept drawn (per kind), booting, and who asked for them."""
    return manager.pool_info()
