"""TLS on the service's own port, with certificates from a local CA the service keeps.

A browser opens a preview at `https://8000-<id>.cubicle.localhost:8000/` (E2B's desktop
stream URL is hard-coded `https://`), while programs keep speaking plain HTTP to
`http://127.0.0.1:8000/`: one port serves both. `TlsOrPlain` reads the first byte of each
connection: a TLS handshake record (0x16) gets TLS in front of uvicorn's HTTP protocol,
anything else goes to that protocol as it is.

`LocalCA` makes a certificate authority once and keeps it in the data directory
(`<data_dir>/ca/`, the key readable by the service's user alone); at every start it issues
the service a fresh certificate for `*.<domain>`, `localhost` and the loopback addresses.
Trusting `ca.pem` (`cubicle ca` says how) makes those names trusted in a browser or a
program; nothing else is signed with it.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import functools
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cubicle.server import certs

_TLS_HANDSHAKE = 0x16
"""The first byte of a TLS record carrying a handshake: a ClientHello opens with it."""
_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LocalCA:
    """The service's certificate authority and the certificate it issued the service."""

    directory: Path
    ca_pem: Path
    """The CA certificate to trust (PEM)."""
    cert_pem: Path
    key_pem: Path

    @classmethod
    def load_or_create(cls, directory: Path, domain: str, hosts: tuple[str, ...] = ()) -> LocalCA:
        """The CA kept in `directory` (made there the first time), and a new certificate
        for `*.<domain>`, `<domain>`, `localhost`, the loopback addresses and `hosts`."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca_pem, ca_key_pem = directory / "ca.pem", directory / "ca-key.pem"
        if ca_pem.is_file() and ca_key_pem.is_file():
            ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
            ca_key = serialization.load_pem_private_key(ca_key_pem.read_bytes(), None)
        else:
            ca_cert, ca_key = certs.new_ca(f"Cubicle local CA {os.uname().nodename}")
            certs.write_private(ca_key_pem, certs.key_bytes(ca_key))
            ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        names = [f"*.{domain}", domain, "localhost", "127.0.0.1", "::1", *hosts]
        cert, key = certs.issue(ca_cert, ca_key, names)
        cert_pem, key_pem = directory / "service.pem", directory / "service-key.pem"
        chain = cert.public_bytes(serialization.Encoding.PEM) + ca_pem.read_bytes()
        certs.write_private(key_pem, certs.key_bytes(key))
        cert_pem.write_bytes(chain)
        return cls(directory, ca_pem, cert_pem, key_pem)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_pem, self.key_pem)
        context.set_alpn_protocols(["http/1.1"])
        return context


def tls_or_plain(http_protocol: type[asyncio.Protocol], context: ssl.SSLContext) -> type:
    """A uvicorn `http` protocol class: `http_protocol` behind TLS or as it is, per
    connection, by the connection's first byte."""

    class TlsOrPlain(asyncio.Protocol):
        def __init__(self, **options: Any) -> None:
            self._make = functools.partial(http_protocol, **options)
            self._loop = options.get("_loop") or asyncio.get_event_loop()
            self._transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self._transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            transport = self._transport
            assert transport is not None
            app = self._make()
            if data[0] != _TLS_HANDSHAKE:
                app.connection_made(transport)
                transport.set_protocol(app)
                app.data_received(data)
                return
            tls = asyncio.sslproto.SSLProtocol(
                self._loop,
                app,
                context,
                None,  # type: ignore[arg-type]  # no waiter: uvicorn hears connection_made
                server_side=True,
                ssl_handshake_timeout=_HANDSHAKE_TIMEOUT_S,  # type: ignore[arg-type]
            )
            tls.connection_made(transport)
            transport.set_protocol(tls)
            view = memoryview(data)
            while view:  # what arrived already is the start of the handshake
                buffer = tls.get_buffer(len(view))
                size = min(len(buffer), len(view))
                buffer[:size] = view[:size]
                tls.buffer_updated(size)
                view = view[size:]

        def connection_lost(self, exc: Exception | None) -> None:
            pass

    return TlsOrPlain
