"""`/api/desktops/{id}/ports`, `/previews` and `/browser/cdp`: what listens inside a desktop,
who may reach it through the service, and its Chromium's DevTools for Playwright."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request, Response
from pydantic import TypeAdapter

from cubicle.protocol.models import DevTools, ListeningPort
from cubicle.protocol.routes import GuestPath
from cubicle.protocol.service import (
    CdpEndpoint,
    Port,
    PortAccess,
    PortInfo,
    PreviewLink,
    PreviewRequest,
)
from cubicle.server.api.deps import GuestDep, ManagerDep, ServicesDep
from cubicle.server.ports.proxy import TOKEN_PARAM
from cubicle.server.shares import PreviewGrant

router = APIRouter(prefix="/api/desktops", tags=["ports"])

_listening = TypeAdapter(list[ListeningPort])
_DEVTOOLS_TIMEOUT_S = 90.0
"""Seconds Chromium may take to start with DevTools on (longer in an emulated microVM)."""


@router.get("/{desktop_id}/ports")
async def list_ports(desktop_id: str, guest: GuestDep, services: ServicesDep) -> list[PortInfo]:
    """The TCP ports programs listen on inside the desktop, each with its address through
    the service (`<port>-<id>.<domain>`)."""
    answer = await guest.request("GET", GuestPath.PORTS)
    ports = services.ports
    return [
        PortInfo(
            port=found.port,
            address=found.address,
            process=found.process,
            pid=found.pid,
            public=ports.is_public(desktop_id, found.port),
            host=ports.host(desktop_id, found.port),
        )
        for found in _listening.validate_json(answer.content)
    ]


@router.put("/{desktop_id}/ports/{port}")
async def set_port_access(
    desktop_id: str, port: Port, body: PortAccess, manager: ManagerDep, services: ServicesDep
) -> PortAccess:
    """Make a port public (anyone who reaches the service may open it, no token) or not."""
    manager.get(desktop_id)
    services.ports.set_public(desktop_id, port, body.public)
    return body


def _describe(grant: PreviewGrant, services: ServicesDep, token: str | None = None) -> PreviewLink:
    url = None
    if token is not None:
        host = services.ports.host(grant.desktop_id, grant.port)
        url = f"https://{host}/?{TOKEN_PARAM}={token}"
    return PreviewLink(
        id=grant.id,
        desktop_id=grant.desktop_id,
        port=grant.port,
        token=token,
        url=url,
        expires_at=grant.expires_at,
        created_at=grant.created_at,
    )


@router.post("/{desktop_id}/ports/{port}/previews", status_code=201)
async def create_preview(
    desktop_id: str,
    port: Port,
    manager: ManagerDep,
    services: ServicesDep,
    body: Annotated[PreviewRequest | None, Body()] = None,
) -> PreviewLink:
    """A link that opens this one port of this one desktop until it expires or is revoked.
    The answer is the only time its token is shown."""
    manager.get(desktop_id)
    ttl_s = (body or PreviewRequest()).ttl_s
    grant, token = services.ports.previews.create(desktop_id, port, ttl_s)
    return _describe(grant, services, token)


@router.get("/{desktop_id}/previews")
async def list_previews(
    desktop_id: str, manager: ManagerDep, services: ServicesDep
) -> list[PreviewLink]:
    manager.get(desktop_id)
    return [_describe(g, services) for g in services.ports.previews.list(desktop_id)]


@router.delete("/{desktop_id}/previews/{link_id}", status_code=204)
async def revoke_preview(desktop_id: str, link_id: str, services: ServicesDep) -> Response:
    """Revoke a preview link: later requests made with it are refused."""
    services.ports.previews.revoke(desktop_id, link_id)
    return Response(status_code=204)


@router.post("/{desktop_id}/browser/cdp")
async def browser_cdp(
    desktop_id: str,
    request: Request,
    guest: GuestDep,
    services: ServicesDep,
    body: Annotated[PreviewRequest | None, Body()] = None,
) -> CdpEndpoint:
    """The desktop's Chromium (started if none runs) with DevTools, as a WebSocket URL
    through the service for `playwright.chromium.connect_over_cdp(url)`: the same browser
    the live view shows. The URL carries a preview token for the DevTools port alone."""
    answer = await guest.request("POST", GuestPath.DEVTOOLS, timeout_s=_DEVTOOLS_TIMEOUT_S)
    devtools = answer.model(DevTools)
    ttl_s = (body or PreviewRequest()).ttl_s
    grant, token = services.ports.previews.create(desktop_id, devtools.port, ttl_s)
    scheme = "wss" if request.url.scheme == "https" else "ws"
    host = request.headers.get("host", f"{request.url.hostname}:{request.url.port}")
    path = f"/ports/{desktop_id}/{devtools.port}{devtools.browser_path}"
    return CdpEndpoint(
        url=f"{scheme}://{host}{path}?{TOKEN_PARAM}={token}",
        expires_at=grant.expires_at,
        port=devtools.port,
    )
