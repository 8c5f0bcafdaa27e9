"""The egress proxy's parts that need no desktop: the ClientHello reader, the secret
store at rest, and the rules' validation."""

from __future__ import annotations

import base64
import os
import ssl

import pytest
from pydantic import ValidationError

from cubicle.protocol.errors import Conflict, NotFound
from cubicle.protocol.service import CreateSecret, DesktopEgress
from cubicle.server.outbound import hello
from cubicle.server.outbound.secrets import SecretStore, host_matches

pytestmark = pytest.mark.fast


def _client_hello(server_name: str | None) -> bytes:
    """The first record Python's own TLS client sends."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    context.check_hostname = server_name is not None
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_the_server_name_is_read_from_a_real_client_hello():
    record = _client_hello("API.Example.com")
    assert hello.record_length(record[:5]) == len(record)
    assert hello.server_name(record) == "api.example.com"
    assert hello.server_name(_client_hello(None)) is None


@pytest.mark.parametrize("garbage", [b"", b"\x16\x03\x01\x00", b"GET / HTTP/1.1\r\n", b"\x16" * 64])
def test_garbage_has_no_server_name(garbage):
    assert hello.server_name(garbage) is None
    assert hello.record_length(b"GET /") is None


def test_a_truncated_hello_has_no_server_name():
    record = _client_hello("api.example.com")
    assert all(hello.server_name(record[:cut]) is None for cut in range(0, 60, 7))


def _secret(name: str = "openai", value: str = "sk-live-123") -> CreateSecret:
    return CreateSecret(name=name, value=value, hosts=["api.openai.com", "*.example.com"])


def test_secrets_are_encrypted_at_rest_and_open_with_their_key_only(tmp_path):
    store = SecretStore(tmp_path)
    info = store.create(_secret())
    assert info.env == "OPENAI" and info.placeholder == "cubicle-secret:openai"
    assert info.header == "Authorization" and info.format == "Bearer {value}"
    on_disk = (tmp_path / "secrets.json").read_bytes()
    assert b"sk-live-123" not in on_disk
    assert oct((tmp_path / "key").stat().st_mode & 0o777) == "0o600"
    assert SecretStore(tmp_path).get("openai").value == "sk-live-123"  # read back
    other_key = base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(ValueError, match="does not open"):
        SecretStore(tmp_path, other_key).list()
    with pytest.raises(Conflict):
        store.create(_secret(value="another"))
    store.delete("openai")
    with pytest.raises(NotFound):
        store.get("openai")
    assert SecretStore(tmp_path).list() == []


def test_a_given_key_must_be_32_bytes(tmp_path):
    with pytest.raises(ValueError, match="32 bytes"):
        SecretStore(tmp_path, "c2hvcnQ=").create(_secret())


def test_host_patterns_match_names_and_names_under_them():
    assert host_matches("api.openai.com", "API.openai.com.")
    assert not host_matches("api.openai.com", "evil-api.openai.com")
    assert host_matches("*.example.com", "a.b.example.com")
    assert not host_matches("*.example.com", "example.com")
    assert not host_matches("*.example.com", "badexample.com")


def test_bad_secrets_and_rules_are_refused_with_the_reason():
    with pytest.raises(ValidationError, match="value"):
        CreateSecret(name="x", value="a\r\nInjected: 1", hosts=["a.b"])
    with pytest.raises(ValidationError, match="once"):
        CreateSecret(name="x", value="v", hosts=["a.b"], format="no placeholder")
    with pytest.raises(ValidationError, match="host name"):
        CreateSecret(name="x", value="v", hosts=["not a host"])
    with pytest.raises(ValidationError):
        CreateSecret(name="x", value="v", hosts=[])
    rules = DesktopEgress(allow=["203.0.113.7", "API.example.com"], deny=["*.evil.test"])
    assert rules.allow == ["203.0.113.7/32", "api.example.com"] and rules.names()
    assert not DesktopEgress(allow=["10.0.0.0/8"]).names()
