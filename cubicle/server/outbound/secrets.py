"""Secrets at rest: encrypted with AES-256-GCM, one key per service.

The key is `CUBICLE_SECRETS_KEY` (32 bytes, base64) when the operator gives one, so that
the data directory alone does not open them; otherwise a key made once in
`<data dir>/secrets/key` (owner-only, like everything there). Each value is sealed with
its name as associated data: a sealed value copied under another name does not open.
Values live decrypted in the service's memory only, for the egress proxy.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cubicle.protocol.errors import Conflict, NotFound
from cubicle.protocol.service import CreateSecret, SecretInfo, placeholder
from cubicle.server.certs import write_private

MAX_SECRETS = 1000


@dataclass(frozen=True)
class Secret:
    """A secret with its value, for the egress proxy."""

    name: str
    value: str
    hosts: tuple[str, ...]
    header: str
    format: str
    env: str
    created_at: datetime

    @property
    def placeholder(self) -> str:
        return placeholder(self.name)

    def sent_to(self, host: str) -> bool:
        """Whether `host` is one of the hosts this secret may be sent to."""
        return any(host_matches(pattern, host) for pattern in self.hosts)

    def info(self) -> SecretInfo:
        return SecretInfo(
            name=self.name,
            hosts=list(self.hosts),
            header=self.header,
            format=self.format,
            env=self.env,
            placeholder=self.placeholder,
            created_at=self.created_at,
        )


def host_matches(pattern: str, host: str) -> bool:
    """`api.example.com` matches itself; `*.example.com` every name under example.com."""
    host = host.lower().rstrip(".")
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


class SecretStore:
    """The service's secrets, in `<data dir>/secrets/secrets.json`."""

    def __init__(self, directory: Path, key: str | None = None) -> None:
        self._directory = directory
        self._path = directory / "secrets.json"
        self._lock = threading.Lock()
        self._aead: AESGCM | None = None
        self._key_text = key
        self._secrets: dict[str, Secret] | None = None

    def _cipher(self) -> AESGCM:
        if self._aead is None:
            self._aead = AESGCM(self._key())
        return self._aead

    def _key(self) -> bytes:
        if self._key_text is not None:
            try:
                key = base64.b64decode(self._key_text, validate=True)
            except binascii.Error:
                key = b""
            if len(key) != 32:
                raise ValueError("CUBICLE_SECRETS_KEY must be 32 bytes in base64")
            return key
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._directory / "key"
        if not path.exists():
            write_private(path, os.urandom(32))
        return path.read_bytes()

    def _load(self) -> dict[str, Secret]:
        if self._secrets is None:
            stored = json.loads(self._path.read_text()) if self._path.exists() else {}
            self._secrets = {}
            for name, entry in stored.items():
                try:
                    sealed = base64.b64decode(entry["sealed"])
                    value = self._cipher().decrypt(sealed[:12], sealed[12:], name.encode())
                except InvalidTag:
                    raise ValueError(
                        f"secret {name!r} does not open with this key: was "
                        "CUBICLE_SECRETS_KEY changed?"
                    ) from None
                self._secrets[name] = Secret(
                    name=name,
                    value=value.decode(),
                    hosts=tuple(entry["hosts"]),
                    header=entry["header"],
                    format=entry["format"],
                    env=entry["env"],
                    created_at=datetime.fromisoformat(entry["created_at"]),
                )
        return self._secrets

    def _save(self, secrets: dict[str, Secret]) -> None:
        stored = {}
        for secret in secrets.values():
            nonce = os.urandom(12)
            sealed = self._cipher().encrypt(nonce, secret.value.encode(), secret.name.encode())
            stored[secret.name] = {
                "sealed": base64.b64encode(nonce + sealed).decode(),
                "hosts": list(secret.hosts),
                "header": secret.header,
                "format": secret.format,
                "env": secret.env,
                "created_at": secret.created_at.isoformat(),
            }
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        staged = self._path.with_suffix(".tmp")
        write_private(staged, json.dumps(stored).encode())
        os.replace(staged, self._path)

    def create(self, body: CreateSecret) -> SecretInfo:
        with self._lock:
            secrets = dict(self._load())
            if body.name in secrets:
                raise Conflict(
                    f"a secret {body.name!r} exists: delete it first to give it a new value"
                )
            if len(secrets) >= MAX_SECRETS:
                raise Conflict(f"this service keeps at most {MAX_SECRETS} secrets")
            secret = Secret(
                name=body.name,
                value=body.value,
                hosts=tuple(dict.fromkeys(body.hosts)),
                header=body.header,
                format=body.format,
                env=body.env or body.name.upper().replace("-", "_"),
                created_at=datetime.now(UTC),
            )
            secrets[body.name] = secret
            self._save(secrets)
            self._secrets = secrets
        return secret.info()

    def list(self) -> list[SecretInfo]:
        with self._lock:
            return [secret.info() for secret in self._load().values()]

    def get(self, name: str) -> Secret:
        with self._lock:
            secret = self._load().get(name)
        if secret is None:
            raise NotFound(f"no secret {name!r}: make it with POST /api/secrets")
        return secret

    def find(self, name: str) -> Secret | None:
        """The secret called `name`, or None once it was deleted."""
        with self._lock:
            return self._load().get(name)

    def delete(self, name: str) -> None:
        with self._lock:
            secrets = dict(self._load())
            if secrets.pop(name, None) is None:
                raise NotFound(f"no secret {name!r}")
            self._save(secrets)
            self._secrets = secrets
