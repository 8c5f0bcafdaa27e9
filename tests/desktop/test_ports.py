"""Ports of a desktop reached through the service: by headers, by host name over TLS, by a
preview link in Chromium, WebSockets, Chromium's DevTools for Playwright, and who may.

A real program listens inside a real desktop (`port_app.py` under uvicorn, started with the
service's interpreter); every request crosses the service and the desktop's guest.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from playwright.sync_api import sync_playwright
from websockets.asyncio.client import connect as ws_async_connect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from cubicle.guest.relay import MAX_RELAYS
from tests.conftest import CHROMIUM_ARGS, create_desktop, wait_until

APP = Path(__file__).with_name("port_app.py")
PORT = 8000


def _exec(api: httpx.Client, desktop_id: str, command: str, timeout_s: float = 30) -> dict:
    answer = api.post(
        f"/api/desktops/{desktop_id}/exec", json={"command": command, "timeout_s": timeout_s}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def start_app(api: httpx.Client, desktop_id: str, port: int = PORT) -> None:
    """Start `port_app.py` inside the desktop, listening on its loopback at `port`."""
    path = f"/api/desktops/{desktop_id}/files"
    api.put(path, params={"path": "/tmp/port_app.py"}, content=APP.read_bytes()).raise_for_status()
    _exec(
        api,
        desktop_id,
        f"cd /tmp && (setsid {sys.executable} -m uvicorn port_app:app --host 127.0.0.1 "
        f"--port {port} --log-level warning > /tmp/port_app.log 2>&1 &)",
    )

    def listening() -> bool:
        found = api.get(f"/api/desktops/{desktop_id}/ports").json()
        return any(p["port"] == port for p in found)

    wait_until(listening, 30, 0.2, f"port_app on port {port} inside {desktop_id}")


@pytest.fixture(scope="module")
def inside(api: httpx.Client, desktop: dict) -> dict:
    """The module's desktop with `port_app` listening on port 8000 inside."""
    start_app(api, desktop["id"])
    return desktop


def by_headers(service, desktop_id: str, port: int = PORT, token: str | None = None) -> dict:
    return {
        "E2b-Sandbox-Id": desktop_id,
        "E2b-Sandbox-Port": str(port),
        "X-Access-Token": token or service.token,
    }


def host_of(service, desktop_id: str, port: int = PORT) -> str:
    return f"{port}-{desktop_id}.cubicle.localhost:{service.url.rsplit(':', 1)[1]}"


# --- reaching a port -------------------------------------------------------------------------


def test_ports_lists_what_listens_inside(api, inside, service):
    found = api.get(f"/api/desktops/{inside['id']}/ports").json()
    app = next(p for p in found if p["port"] == PORT)
    assert app["address"] == "127.0.0.1"
    assert app["process"].startswith("python")
    assert app["host"] == host_of(service, inside["id"])
    assert app["public"] is False
    assert inside["domain"] == f"cubicle.localhost:{service.url.rsplit(':', 1)[1]}"


def test_a_port_answers_by_headers_with_authorization_untouched(inside, service):
    headers = {**by_headers(service, inside["id"]), "Authorization": "Bearer for-the-app"}
    answer = httpx.get(f"{service.url}/headers?x=1", headers=headers)
    assert answer.status_code == 200, answer.text
    seen = dict(answer.json()["headers"])
    assert seen["authorization"] == "Bearer for-the-app"
    assert "x-access-token" not in seen and "e2b-sandbox-id" not in seen
    assert seen["x-forwarded-proto"] == "http"
    assert answer.json()["query"] == "x=1"


def test_keep_alive_requests_reuse_the_way_in(inside, service):
    with httpx.Client(base_url=service.url, headers=by_headers(service, inside["id"])) as client:
        answers = [client.get("/").json() for _ in range(20)]
    assert answers == [{"hello": "from inside", "path": "/"}] * 20


def test_bodies_stream_both_ways(inside, service):
    """An 8 MiB upload (twice the service's body limit: the proxy carries any size) arrives
    whole, and an answer's first line shows before the program has written the rest."""
    headers = by_headers(service, inside["id"])
    body = bytes(range(256)) * (8 * 4096)
    echoed = httpx.post(f"{service.url}/echo", headers=headers, content=body, timeout=60)
    assert echoed.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}

    def pieces() -> Iterator[bytes]:
        yield b"chunked "
        yield b"upload"

    chunked = httpx.post(f"{service.url}/echo", headers=headers, content=pieces())
    assert chunked.json()["length"] == len(b"chunked upload")

    with httpx.stream("GET", f"{service.url}/stream", headers=headers, timeout=30) as stream:
        lines = stream.iter_lines()
        assert next(lines) == "first"  # the program waits for /release before the rest
        assert httpx.get(f"{service.url}/release", headers=headers).json() == {"released": True}
        assert next(lines) == "second"


def test_a_200_mb_download_arrives_whole(inside, service):
    digest, size = hashlib.sha256(), 0
    url = f"{service.url}/big?mb=200"
    with httpx.stream("GET", url, headers=by_headers(service, inside["id"]), timeout=60) as got:
        assert got.headers["content-length"] == str(200 << 20)
        for chunk in got.iter_bytes():
            digest.update(chunk)
            size += len(chunk)
    expected = hashlib.sha256(bytes(range(256)) * 4096 * 200).hexdigest()
    assert (size, digest.hexdigest()) == (200 << 20, expected)


def test_websockets_echo_by_headers_and_by_host(inside, service):
    ws_url = service.url.replace("http://", "ws://") + "/ws"
    headers = by_headers(service, inside["id"])
    with ws_connect(ws_url, additional_headers=headers, subprotocols=["echo.v1"]) as ws:
        assert ws.subprotocol == "echo.v1"
        ws.send("hello")
        assert ws.recv(timeout=10) == "hello"
        ws.send(b"\x00\x01" * 100_000)
        assert ws.recv(timeout=10) == b"\x00\x01" * 100_000
    # by host name: the client asks for the name, the socket goes to the service
    sock = socket.create_connection(("127.0.0.1", int(service.url.rsplit(":", 1)[1])))
    named = f"ws://{host_of(service, inside['id'])}/ws"
    token = {"X-Access-Token": service.token}
    with ws_connect(named, sock=sock, additional_headers=token) as ws:
        ws.send("by host")
        assert ws.recv(timeout=10) == "by host"


def test_a_websocket_the_program_refuses_is_refused_with_its_status(inside, service):
    url = service.url.replace("http://", "ws://") + "/ws-refused"
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(url, additional_headers=by_headers(service, inside["id"])).close()
    assert refused.value.response.status_code == 403
    closed = by_headers(service, inside["id"], port=8999)
    with pytest.raises(InvalidStatus) as nothing:
        ws_connect(url, additional_headers=closed).close()
    assert nothing.value.response.status_code == 502
    assert b"port_closed" in nothing.value.response.body


def _ca(service) -> Path:
    return Path(service.data_dir) / "ca" / "ca.pem"


def test_a_port_answers_by_host_name_over_tls_with_the_local_ca(inside, service):
    name = host_of(service, inside["id"]).split(":")[0]
    trusting = ssl.create_default_context(cafile=str(_ca(service)))
    with httpx.Client(verify=trusting) as client:
        answer = client.get(
            f"https://127.0.0.1:{service.url.rsplit(':', 1)[1]}/headers",
            headers={"Host": host_of(service, inside["id"]), "X-Access-Token": service.token},
            extensions={"sni_hostname": name},
        )
    assert answer.status_code == 200, answer.text
    assert dict(answer.json()["headers"])["x-forwarded-proto"] == "https"
    # the same port keeps answering plain HTTP, and a client that trusts nothing else refuses
    assert httpx.get(f"{service.url}/healthz").status_code == 200
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://127.0.0.1:{service.url.rsplit(':', 1)[1]}/healthz")


def _spki_hash(pem: Path) -> str:
    cert = x509.load_pem_x509_certificate(pem.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def test_a_preview_link_opens_the_port_in_chromium(api, inside, service):
    """Chromium, trusting the service's CA (by its key), opens the link; the token leaves
    the address for a cookie of that one host; without the link the page is refused."""
    link = api.post(f"/api/desktops/{inside['id']}/ports/{PORT}/previews", json={}).json()
    assert link["url"].startswith(f"https://{host_of(service, inside['id'])}/?cubicle_token=")
    trust = f"--ignore-certificate-errors-spki-list={_spki_hash(_ca(service))}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=[*CHROMIUM_ARGS, trust]
        )
        try:
            page = browser.new_page()
            page.goto(link["url"])
            assert json.loads(page.inner_text("body")) == {"hello": "from inside", "path": "/"}
            assert "cubicle_token" not in page.url
            page.goto(f"https://{host_of(service, inside['id'])}/headers")
            seen = dict(json.loads(page.inner_text("body"))["headers"])
            assert "cubicle_preview" not in seen.get("cookie", "")
            stranger = browser.new_page()  # another context: no cookie
            response = stranger.goto(f"https://{host_of(service, inside['id'])}/")
            assert response is not None and response.status == 401
        finally:
            browser.close()


# --- who may ---------------------------------------------------------------------------------


def test_preview_links_are_scoped_expire_and_revoke(api, inside, service):
    desktop_id = inside["id"]
    link = api.post(f"/api/desktops/{desktop_id}/ports/{PORT}/previews", json={}).json()
    token = link["token"]
    assert (
        httpx.get(
            f"{service.url}/", headers=by_headers(service, desktop_id, token=token)
        ).status_code
        == 200
    )
    other_port = httpx.get(f"{service.url}/", headers=by_headers(service, desktop_id, 8001, token))
    assert other_port.status_code == 403, other_port.text
    other_desktop = create_desktop(api)
    try:
        elsewhere = by_headers(service, other_desktop["id"], PORT, token)
        assert httpx.get(f"{service.url}/", headers=elsewhere).status_code == 403
    finally:
        api.delete(f"/api/desktops/{other_desktop['id']}")
    assert (
        httpx.get(
            f"{service.url}/api/desktops", headers={"Authorization": f"Bearer {token}"}
        ).status_code
        == 401
    )
    listed = api.get(f"/api/desktops/{desktop_id}/previews").json()
    assert link["id"] in [p["id"] for p in listed] and all(p["token"] is None for p in listed)
    assert api.delete(f"/api/desktops/{desktop_id}/previews/{link['id']}").status_code == 204
    revoked = httpx.get(f"{service.url}/", headers=by_headers(service, desktop_id, token=token))
    assert revoked.status_code == 401 and "revoked" in revoked.json()["detail"]

    short = api.post(f"/api/desktops/{desktop_id}/ports/{PORT}/previews", json={"ttl_s": 1}).json()
    time.sleep(1.5)
    expired = httpx.get(
        f"{service.url}/", headers=by_headers(service, desktop_id, token=short["token"])
    )
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]


def test_no_token_no_entry_and_never_the_admin_token_in_an_address(inside, service):
    desktop_id = inside["id"]
    bare = {"E2b-Sandbox-Id": desktop_id, "E2b-Sandbox-Port": str(PORT)}
    refused = httpx.get(f"{service.url}/", headers=bare)
    assert refused.status_code == 401 and "previews" in refused.json()["detail"]
    unknown = httpx.get(f"{service.url}/", headers={**bare, "E2b-Sandbox-Id": "nosuchdesktop"})
    assert unknown.status_code == 401  # no token: nothing said of which desktops exist
    in_url = httpx.get(f"{service.url}/?cubicle_token={service.token}", headers=bare)
    assert in_url.status_code == 401 and "X-Access-Token" in in_url.json()["detail"]
    assert httpx.get(f"{service.url}/healthz").status_code == 200


def test_a_public_port_needs_no_token(api, inside, service):
    desktop_id = inside["id"]
    bare = {"Host": host_of(service, desktop_id)}
    assert httpx.get(f"{service.url}/", headers=bare).status_code == 401
    api.put(f"/api/desktops/{desktop_id}/ports/{PORT}", json={"public": True}).raise_for_status()
    try:
        assert httpx.get(f"{service.url}/", headers=bare).json()["hello"] == "from inside"
        listed = api.get(f"/api/desktops/{desktop_id}/ports").json()
        assert next(p for p in listed if p["port"] == PORT)["public"] is True
    finally:
        api.put(f"/api/desktops/{desktop_id}/ports/{PORT}", json={"public": False})
    assert httpx.get(f"{service.url}/", headers=bare).status_code == 401


def test_bad_addresses_answer_clearly(inside, service):
    headers = by_headers(service, inside["id"])
    too_big = httpx.get(f"{service.url}/", headers={**headers, "E2b-Sandbox-Port": "99999"})
    assert too_big.status_code == 422, too_big.text
    half = httpx.get(f"{service.url}/", headers={"E2b-Sandbox-Id": inside["id"]})
    assert half.status_code == 422
    closed = httpx.get(f"{service.url}/", headers={**headers, "E2b-Sandbox-Port": "8999"})
    assert closed.status_code == 502 and closed.json()["error"] == "port_closed"
    missing = httpx.get(f"{service.url}/", headers={**headers, "E2b-Sandbox-Id": "nosuchdesktop"})
    assert missing.status_code == 404
    assert httpx.get(f"{service.url}/", headers=headers).status_code == 200  # still answering


def test_a_flood_of_connections_is_refused_past_the_cap_and_nothing_else_suffers(
    api, inside, service
):
    """More WebSockets than a guest relays at once: the ones past the cap are refused
    `busy` (429), the desktop and the service keep answering, and once they close the port
    opens again."""
    url = service.url.replace("http://", "ws://") + "/ws"
    headers = by_headers(service, inside["id"])

    async def flood() -> list[object]:
        async def one() -> object:
            try:
                return await ws_async_connect(url, additional_headers=headers, open_timeout=60)
            except InvalidStatus as exc:
                return exc.response.status_code

        opened = await asyncio.gather(*(one() for _ in range(MAX_RELAYS + 20)))
        assert (
            api.post(f"/api/desktops/{inside['id']}/exec", json={"command": "true"}).json()[
                "exit_code"
            ]
            == 0
        )
        assert api.get(f"/api/desktops/{inside['id']}/screenshot").status_code == 200
        for ws in opened:
            if not isinstance(ws, int):
                await ws.close()
        return opened

    opened = asyncio.run(flood())
    refused = [o for o in opened if isinstance(o, int)]
    assert refused and set(refused) == {429}, refused
    assert len(opened) - len(refused) >= MAX_RELAYS - 8  # the pool's idle ones count too
    assert httpx.get(f"{service.url}/healthz").status_code == 200

    def opens_again() -> bool:
        try:
            with ws_connect(url, additional_headers=headers) as ws:
                ws.send("again")
                return ws.recv(timeout=10) == "again"
        except InvalidStatus:
            return False

    wait_until(opens_again, 15, 0.2, "a WebSocket to open once the flood closed")


# --- Chromium's DevTools ---------------------------------------------------------------------


def test_playwright_drives_the_desktops_chromium_over_cdp(api, inside):
    """`connect_over_cdp` with the URL the service gives types into a page of the desktop's
    own Chromium: its window on the desktop's screen takes the typed title."""
    endpoint = api.post(f"/api/desktops/{inside['id']}/browser/cdp", json={}, timeout=120).json()
    assert endpoint["url"].startswith("ws://") and "cubicle_token=preview1." in endpoint["url"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(endpoint["url"], timeout=60_000)
        context = browser.contexts[0]
        page = context.new_page()
        page.goto("data:text/html,<input id=q oninput='document.title=this.value'>")
        page.fill("#q", "typed over cdp")
        assert page.title() == "typed over cdp"
        browser.close()

    def titled() -> bool:
        windows = api.get(f"/api/desktops/{inside['id']}/windows").json()
        return any("typed over cdp" in w["title"] for w in windows)

    wait_until(titled, 15, 0.2, "the desktop's Chromium window to show the typed title")


def test_the_devtools_port_is_reachable_only_through_the_service(api, inside, service):
    endpoint = api.post(f"/api/desktops/{inside['id']}/browser/cdp", json={}, timeout=120).json()
    port = endpoint["port"]
    with pytest.raises(OSError):  # not on the host
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    other = create_desktop(api)
    try:
        probe = _exec(api, other["id"], f"curl -sS -m 3 http://127.0.0.1:{port}/json/version")
        assert probe["exit_code"] != 0, probe  # nor from another desktop
        refused = httpx.get(
            f"{service.url}/json/version", headers=by_headers(service, other["id"], port)
        )
        assert refused.status_code == 502  # nor through the service by another desktop's id
    finally:
        api.delete(f"/api/desktops/{other['id']}")
    version = httpx.get(
        f"{service.url}/json/version", headers=by_headers(service, inside["id"], port)
    )
    assert version.status_code == 200 and "webSocketDebuggerUrl" in version.json()


def test_a_desktop_cannot_reach_another_desktops_ports(api, inside, service):
    other = create_desktop(api)
    try:
        probe = _exec(api, other["id"], f"curl -sS -m 3 http://127.0.0.1:{PORT}/")
        assert probe["exit_code"] != 0, probe
    finally:
        api.delete(f"/api/desktops/{other['id']}")
    answer = httpx.get(f"{service.url}/", headers=by_headers(service, inside["id"]))
    assert answer.json()["hello"] == "from inside"
