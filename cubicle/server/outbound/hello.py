"""The server name a TLS client asks for, read from its ClientHello without answering it."""

from __future__ import annotations

import struct

HANDSHAKE = 0x16
"""A TLS record carrying a handshake: a ClientHello's first byte."""
_CLIENT_HELLO = 1
_SERVER_NAME = 0


def record_length(head: bytes) -> int | None:
    """The length of the TLS record that `head` (at least 5 bytes) opens, or None when it
    is not a handshake record."""
    if len(head) < 5 or head[0] != HANDSHAKE:
        return None
    return 5 + struct.unpack_from("!H", head, 3)[0]


def server_name(record: bytes) -> str | None:
    """The SNI host name of a ClientHello record, lower-cased; None when it has none or
    the record is not a ClientHello (a truncated or malformed one included)."""
    try:
        return _server_name(record)
    except (struct.error, IndexError, UnicodeDecodeError):
        return None


def _server_name(record: bytes) -> str | None:
    if record[0] != HANDSHAKE or record[5] != _CLIENT_HELLO:
        return None
    at = 5 + 4 + 2 + 32  # record header, handshake header, version, random
    at += 1 + record[at]  # session id
    at += 2 + struct.unpack_from("!H", record, at)[0]  # cipher suites
    at += 1 + record[at]  # compression methods
    end = at + 2 + struct.unpack_from("!H", record, at)[0]
    at += 2
    while at + 4 <= min(end, len(record)):
        kind, length = struct.unpack_from("!HH", record, at)
        at += 4
        if kind == _SERVER_NAME:
            # a list (2-byte length) of (type, 2-byte length, name); type 0 is a host name
            if record[at + 2] != 0:
                return None
            size = struct.unpack_from("!H", record, at + 3)[0]
            name = record[at + 5 : at + 5 + size]
            if len(name) != size:
                return None
            return name.decode("ascii").lower().rstrip(".") or None
        at += length
    return None
