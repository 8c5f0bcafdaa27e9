"""FastAPI dependencies that hand out the long-lived objects built by the app's lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from desktop.guest_client import GuestClient
from desktop.manager import SandboxManager
from desktop.settings import Settings


def get_manager(request: Request) -> SandboxManager:
    return request.app.state.manager


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


ManagerDep = Annotated[SandboxManager, Depends(get_manager)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_guest(desktop_id: str, manager: ManagerDep) -> GuestClient:
    return manager.guest(desktop_id)


GuestDep = Annotated[GuestClient, Depends(get_guest)]
