"""The port proxy's parts without a desktop: how a request is addressed, the guest's relay
over a real socket, the local CA and TLS beside plain HTTP on one port.

The whole path, desktop included, is `tests/desktop/test_ports.py`.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from cryptography import x509
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cubicle.guest.relay import Relays, SecretCheck, listening, relay_protocol
from cubicle.protocol.errors import AuthError, InvalidRequest, PortClosed
from cubicle.server.guest_client import GuestClient, GuestEndpoint
from cubicle.server.ports.proxy import PortProxy, _without_own_cookie
from cubicle.server.ports.tls import LocalCA, tls_or_plain

pytestmark = pytest.mark.fast


def _scope(headers: dict[str, str], path: str = "/x", query: str = "", kind: str = "http"):
    return {
        "type": kind,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()],
    }


PROXY = PortProxy(app=None, domain_name="cubicle.localhost")  # type: ignore[arg-type]


def test_a_request_is_for_a_port_by_headers_or_host_or_websocket_path():
    by_headers = PROXY.route(_scope({"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "3000"}))
    assert (by_headers.desktop_id, by_headers.port, by_headers.form) == ("abc123", 3000, "headers")
    by_host = PROXY.route(_scope({"Host": "8080-ABC123.Cubicle.Localhost:8000"}, query="a=1"))
    assert (by_host.desktop_id, by_host.port, by_host.path) == ("abc123", 8080, b"/x?a=1")
    ws = PROXY.route(
        _scope({}, "/ports/abc123/9222/devtools/browser/u", "cubicle_token=t", "websocket")
    )
    assert (ws.port, ws.path, ws.token, ws.form) == (9222, b"/devtools/browser/u", "t", "path")
    # the service's own requests are not the proxy's
    assert PROXY.route(_scope({"Host": "127.0.0.1:8000"}, "/api/desktops")) is None
    assert PROXY.route(_scope({"Host": "8080-abc.other.example"})) is None
    assert PROXY.route(_scope({}, "/ports/abc123/9222/")) is None  # plain HTTP by path: no


def test_the_proxys_token_leaves_the_query_and_the_rest_stays():
    target = PROXY.route(
        _scope({"Host": "80-d1.cubicle.localhost"}, "/p", "a=1&cubicle_token=tok&b=%20")
    )
    assert (target.token, target.path) == ("tok", b"/p?a=1&b=+")
    assert _without_own_cookie(b"a=1; cubicle_preview=tok; b=2") == b"a=1; b=2"
    assert _without_own_cookie(b"cubicle_preview=tok") is None
    assert _without_own_cookie(b"theme=dark") == b"theme=dark"


@pytest.mark.parametrize(
    "headers",
    [
        {"E2b-Sandbox-Id": "abc"},
        {"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "70000"},
        {"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "http"},
        {"Host": "0-abc.cubicle.localhost"},
        {"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "8\u00ff"},
    ],
)
def test_a_malformed_address_is_a_422(headers):
    with pytest.raises(InvalidRequest):
        PROXY.route(_scope(headers))


# --- the guest's relay -----------------------------------------------------------------------


async def _hello(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"guest"})


@pytest.fixture
def guest_socket(tmp_path: Path) -> Iterator[Path]:
    """A guest-like HTTP server on a Unix socket, with the relay protocol and a secret."""
    path = tmp_path / "guest.sock"
    relays = Relays()
    config = uvicorn.Config(
        _hello,
        uds=str(path),
        http=relay_protocol(SecretCheck("s3cret"), relays),
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield path
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP echo server on this host's loopback (the relay's `inside`, here)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    listener.close()


def test_the_relay_carries_bytes_both_ways_and_half_closes(guest_socket, echo_port):
    async def main() -> bytes:
        client = GuestClient(GuestEndpoint(uds=str(guest_socket), secret="s3cret"))
        sock = await client.open_relay(echo_port)
        loop = asyncio.get_running_loop()
        payload = bytes(range(256)) * 8192  # 2 MiB
        await loop.sock_sendall(sock, payload)
        sock.shutdown(socket.SHUT_WR)  # the far side hears the end, answers, and closes
        received = bytearray()
        while chunk := await loop.sock_recv(sock, 1 << 20):
            received += chunk
        sock.close()
        await client.close()
        return bytes(received)

    assert asyncio.run(main()) == bytes(range(256)) * 8192


def test_the_relay_refuses_without_the_secret_and_says_when_nothing_listens(guest_socket):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    free = closed.getsockname()[1]
    closed.close()

    async def main() -> None:
        wrong = GuestClient(GuestEndpoint(uds=str(guest_socket), secret="wrong"))
        with pytest.raises(AuthError):
            await wrong.open_relay(free)
        right = GuestClient(GuestEndpoint(uds=str(guest_socket), secret="s3cret"))
        with pytest.raises(PortClosed, match=f"nothing listens on port {free}"):
            await right.open_relay(free)
        answer = await right.request("GET", "/")  # the same listener still serves HTTP
        assert answer.content == b"guest"
        await wrong.close()
        await right.close()

    asyncio.run(main())


def test_listening_names_the_port_and_its_process():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, time; s = socket.create_server(('127.0.0.1', 0)); "
            "print(s.getsockname()[1], flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        found = {p.port: p for p in listening()}
        assert found[port].address == "127.0.0.1"
        assert found[port].pid == child.pid
        assert found[port].process is not None and found[port].process.startswith("python")
    finally:
        child.kill()
        child.wait()


# --- TLS beside plain HTTP -------------------------------------------------------------------


def test_the_local_ca_is_made_once_and_signs_the_ports_names(tmp_path: Path):
    first = LocalCA.load_or_create(tmp_path / "ca", "cubicle.localhost", ("10.1.2.3",))
    ca, leaf = (
        first.ca_pem.read_bytes(),
        x509.load_pem_x509_certificate(first.cert_pem.read_bytes()),
    )
    second = LocalCA.load_or_create(tmp_path / "ca", "cubicle.localhost")
    assert second.ca_pem.read_bytes() == ca  # kept, not made again
    assert (tmp_path / "ca" / "ca-key.pem").stat().st_mode & 0o077 == 0
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "*.cubicle.localhost" in names.get_values_for_type(x509.DNSName)
    assert "10.1.2.3" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]


def test_one_port_answers_http_and_https(tmp_path: Path):
    ca = LocalCA.load_or_create(tmp_path / "ca", "cubicle.localhost")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scheme(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["scheme"].encode()})

    config = uvicorn.Config(
        scheme,
        host="127.0.0.1",
        port=port,
        http=tls_or_plain(HttpToolsProtocol, ca.server_context()),
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "http"
        trusting = ssl.create_default_context(cafile=str(ca.ca_pem))
        with httpx.Client(verify=trusting) as client:
            name = "8000-abc.cubicle.localhost"
            answer = client.get(f"https://127.0.0.1:{port}/", extensions={"sni_hostname": name})
            assert answer.text == "https"
        with pytest.raises(httpx.ConnectError):  # a client that trusts only the system's CAs
            httpx.get(f"https://127.0.0.1:{port}/")
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "http"  # still serving
    finally:
        server.should_exit = True
        thread.join(10)
