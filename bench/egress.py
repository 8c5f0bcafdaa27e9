"""`egress`: what the egress proxy adds to a desktop's HTTPS requests.

An HTTPS API (`tests/security/api_server.py`, a certificate from a CA made for the run)
listens on this host's own address, which the service's operator list lets desktops
reach (`CUBICLE_EGRESS_ALLOW`); desktops reach it as `api.bench.test` (`"hosts"`). Three
desktops make the same requests with Python's `http.client`, in turns:

- `direct`: a desktop without rules by name or secrets: slirp4netns straight out (the
  baseline);
- `by_name`: `egress.allow = ["api.bench.test"]`: the proxy reads the SNI and passes the
  TLS bytes through;
- `secret`: a desktop with a secret for that host: the proxy ends TLS with the desktop's
  CA, puts the value in the request's header, and opens its own TLS to the API.

Per way: a GET on one keep-alive connection (p50/p95), and a GET on a new connection each
time (connect, TLS handshake, request), which is where the proxy's own work sits.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, summarize
from cubicle.server import certs
from cubicle.server.runtime.egress import host_addresses

SERVER = Path(__file__).resolve().parents[1] / "tests" / "security" / "api_server.py"
NAME = "api.bench.test"
CLIENT = """
import http.client, json, ssl, sys, time
n, m, cafile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].strip("-")
context = ssl.create_default_context(cafile=cafile or None)
def connection():
    return http.client.HTTPSConnection("api.bench.test", 443, context=context, timeout=20)
def get(conn, path):
    conn.request("GET", path)
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 200, answer.status
kept = connection()
for _ in range(20):
    get(kept, "/warm")
keep, fresh = [], []
for _ in range(n):
    started = time.perf_counter(); get(kept, "/keep"); keep.append(time.perf_counter() - started)
for _ in range(m):
    started = time.perf_counter()
    conn = connection(); get(conn, "/fresh"); conn.close()
    fresh.append(time.perf_counter() - started)
print(json.dumps({"keep": keep, "fresh": fresh}))
"""


@dataclass(frozen=True)
class Way:
    keep_alive: Summary
    """A GET on one keep-alive connection."""
    new_connection: Summary
    """Connect, TLS handshake and a GET."""


@dataclass(frozen=True)
class EgressResult:
    direct: Way
    by_name: Way
    secret: Way
    added_p50_ms_keep_alive_secret: float
    added_p50_ms_new_connection_secret: float
    added_p50_ms_keep_alive_by_name: float
    added_p50_ms_new_connection_by_name: float
    targets: list[Target]


def _host_address() -> str:
    for address in sorted(host_addresses(), key=str):
        if address.version == 4 and not address.is_loopback:
            return str(address)
    raise RuntimeError("the egress benchmark needs an IPv4 address of this host's own")


def _ports_free(address: str) -> None:
    for port in (80, 443):
        with socket.socket() as probe:
            try:
                probe.bind((address, port))
            except OSError as exc:
                raise RuntimeError(f"port {port} of {address} is taken: {exc}") from None


def _desktop(service: Service, body: dict, ca: bytes) -> str:
    response = service.client.post("/api/desktops", json=body)
    if response.status_code != 201:
        raise RuntimeError(f"create failed: {response.status_code} {response.text}")
    desktop_id = response.json()["id"]
    service.desktop_ids.add(desktop_id)
    for path, data in (("~/ca.pem", ca), ("~/client.py", CLIENT.encode())):
        put = service.client.put(
            f"/api/desktops/{desktop_id}/files", params={"path": path}, content=data
        )
        put.raise_for_status()
    return desktop_id


def _measure(service: Service, desktop_id: str, n: int, m: int, cafile: str) -> dict:
    command = f"python3 ~/client.py {n} {m} {cafile}"
    response = service.client.post(
        f"/api/desktops/{desktop_id}/exec",
        json={"command": command, "timeout_s": 600},
        timeout=620,
    )
    response.raise_for_status()
    result = response.json()
    if result["exit_code"] != 0:
        raise RuntimeError(f"the client failed in {desktop_id}: {result['stderr'][-2000:]}")
    return json.loads(result["stdout"])


def run(options: Options) -> EgressResult:
    n, m, rounds = (100, 20, 2) if options.quick else (500, 100, 4)
    address = _host_address()
    _ports_free(address)
    files = Path(tempfile.mkdtemp(prefix="cubicle-bench-egress-"))
    ca_cert, ca_key = certs.new_ca("cubicle bench CA")
    cert, key = certs.issue(ca_cert, ca_key, [NAME])
    (files / "ca.pem").write_bytes(certs.pem(ca_cert))
    (files / "cert.pem").write_bytes(certs.pem(cert))
    certs.write_private(files / "key.pem", certs.key_bytes(key))
    log = files / "requests.jsonl"
    server = subprocess.Popen(
        [sys.executable, str(SERVER), str(files / "cert.pem"), str(files / "key.pem"), str(log)],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not (log.exists() and "ready" in log.read_text()):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the benchmark's API server did not start")
            time.sleep(0.05)
        env = {
            "CUBICLE_WARM_POOL": "0",
            "CUBICLE_EGRESS_ALLOW": f"{ipaddress.ip_address(address)}/32",
            "CUBICLE_EGRESS_CA_FILE": str(files / "ca.pem"),
        }
        with running_service(**env) as service:
            secret = {"name": "bench", "value": "sk-bench-123", "hosts": [NAME]}
            service.client.post("/api/secrets", json=secret).raise_for_status()
            base = {"network": True, "hosts": {NAME: address}}
            ca = certs.pem(ca_cert)
            progress("egress: three desktops")
            ways = {
                "direct": (_desktop(service, base, ca), "/home/user/ca.pem"),
                "by_name": (
                    _desktop(service, {**base, "egress": {"allow": [NAME]}}, ca),
                    "/home/user/ca.pem",
                ),
                "secret": (_desktop(service, {**base, "secrets": ["bench"]}, ca), "-"),
            }
            samples: dict[str, dict[str, list[float]]] = {
                name: {"keep": [], "fresh": []} for name in ways
            }
            for turn in range(rounds):
                for name, (desktop_id, cafile) in ways.items():
                    progress(f"egress: round {turn + 1}/{rounds}, {name}")
                    found = _measure(service, desktop_id, n // rounds, m // rounds, cafile)
                    for kind in ("keep", "fresh"):
                        samples[name][kind] += found[kind]
    finally:
        server.kill()
        server.wait()
    summary = {
        name: Way(summarize(values["keep"]), summarize(values["fresh"]))
        for name, values in samples.items()
    }

    def added(name: str, kind: str) -> float:
        way, base_way = summary[name], summary["direct"]
        if kind == "keep":
            return round(way.keep_alive.p50_ms - base_way.keep_alive.p50_ms, 3)
        return round(way.new_connection.p50_ms - base_way.new_connection.p50_ms, 3)

    return EgressResult(
        direct=summary["direct"],
        by_name=summary["by_name"],
        secret=summary["secret"],
        added_p50_ms_keep_alive_secret=added("secret", "keep"),
        added_p50_ms_new_connection_secret=added("secret", "fresh"),
        added_p50_ms_keep_alive_by_name=added("by_name", "keep"),
        added_p50_ms_new_connection_by_name=added("by_name", "fresh"),
        targets=[],
    )
