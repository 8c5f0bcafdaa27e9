"""Ports of desktops, reached through the service: the proxy, who may use it, its TLS.

A program listening inside a desktop (a dev server, a WebSocket, Chromium's DevTools) is
reached through the service's own port, and only so: the service asks the desktop's guest
for a byte stream to the port (`cubicle.guest.relay`) and carries HTTP and WebSockets over
it (`proxy`). Who may: the admin token, a preview link scoped to one desktop and one port
(`cubicle.server.shares.PreviewLinks`), or nobody needs to for a port made public (`Ports`).
Browsers get TLS on the same port, from the service's local CA (`tls`).
"""

from __future__ import annotations

from cubicle.server.events import DesktopEnded, DesktopEvent, Events
from cubicle.server.settings import Settings
from cubicle.server.shares import PreviewLinks


class Ports:
    """What the port proxy needs to know of one service: its domain, the preview links,
    the ports made public."""

    def __init__(self, settings: Settings, events: Events) -> None:
        self.domain = settings.port_domain
        """What follows `<port>-<id>.` in a port's host name (a port of its own included)."""
        self.previews = PreviewLinks(events)
        self._public: set[tuple[str, int]] = set()
        self._unsubscribe = events.subscribe(self._on_event)

    def close(self) -> None:
        self._unsubscribe()
        self.previews.close()

    def _on_event(self, event: DesktopEvent) -> None:
        if isinstance(event, DesktopEnded):
            self._public = {(d, p) for d, p in self._public if d != event.desktop_id}

    def host(self, desktop_id: str, port: int) -> str:
        """`<port>-<id>.<domain>`: the port's address through the service."""
        return f"{port}-{desktop_id}.{self.domain}"

    def set_public(self, desktop_id: str, port: int, public: bool) -> None:
        if public:
            self._public.add((desktop_id, port))
        else:
            self._public.discard((desktop_id, port))

    def is_public(self, desktop_id: str, port: int) -> bool:
        return (desktop_id, port) in self._public
