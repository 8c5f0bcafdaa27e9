"""FastAPI dependencies that hand out the long-lived objects built by the app's lifespan.

They are `async def` although they never wait: FastAPI runs a plain `def` dependency on its
thread pool, a thread hop per dependency per request for an attribute lookup.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from cubicle.server.guest_client import GuestClient
from cubicle.server.manager import SandboxManager
from cubicle.server.services import Services, services_of
from cubicle.server.settings import Settings


async def get_services(request: Request) -> Services:
    return services_of(request)


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_manager(services: ServicesDep) -> SandboxManager:
    return services.manager


async def get_settings_dep(services: ServicesDep) -> Settings:
    return services.settings


ManagerDep = Annotated[SandboxManager, Depends(get_manager)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_guest(desktop_id: str, manager: ManagerDep) -> GuestClient:
    return await manager.awake(desktop_id)


GuestDep = Annotated[GuestClient, Depends(get_guest)]
