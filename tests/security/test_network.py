"""`network: true` reaches the internet and nothing of the host, its networks or cloud
metadata; the operator's lists win; slirp4netns runs as no one in particular.

Everything happens in network namespaces this test makes (`netns.py`): a service of its
own in T, "the world" in W. Nothing is probed outside this machine.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cubicle.server.launcher import ServiceProcess
from tests.security.attack import create, probe, still_answering
from tests.security.netns import (
    HOST_ADDRESS,
    WORLD_ADDRESSES,
    Namespaces,
    NetnsThread,
    Via,
    service_inside,
)

pytestmark = pytest.mark.root_only
PORT = 47_123


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[Namespaces, Path, Path]]:
    logs = tmp_path_factory.mktemp("listeners")
    with Namespaces(f"{os.getpid()}") as spaces:
        here, there = logs / "host.jsonl", logs / "world.jsonl"
        listeners = [spaces.listener(spaces.t, PORT, here), spaces.listener(spaces.w, PORT, there)]
        deadline = time.monotonic() + 10
        while not all(p.exists() and "ready" in p.read_text() for p in (here, there)):
            assert time.monotonic() < deadline, "the listeners did not start"
            time.sleep(0.05)
        try:
            yield spaces, here, there
        finally:
            for listener in listeners:
                listener.kill()
                listener.wait()


@pytest.fixture(scope="module")
def inside_t(world) -> Iterator[NetnsThread]:
    thread = NetnsThread(world[0].t)
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def t_service(world, inside_t) -> Iterator[tuple[ServiceProcess, httpx.Client]]:
    """A service of its own inside T, with the operator's allow and deny lists."""
    env = {
        "CUBICLE_EGRESS_ALLOW": f"{WORLD_ADDRESSES['allowed_by_operator']}/32",
        "CUBICLE_EGRESS_DENY": f"{WORLD_ADDRESSES['denied_by_operator']}/32",
    }
    with service_inside(world[0].t, inside_t, env) as (service, client):
        yield service, client


def _arrivals(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if '"ready"' not in line]


def test_a_desktop_reaches_the_internet_and_nothing_of_the_host(world, inside_t, t_service):
    _, here, there = world
    api = Via(inside_t, t_service[1])
    desktop = create(api, network=True)
    targets = {name: f"{address}:{PORT}" for name, address in WORLD_ADDRESSES.items()}
    targets["host"] = f"{HOST_ADDRESS}:{PORT}"
    targets["host_loopback"] = f"10.0.2.2:{PORT}"
    found = probe(api, desktop["id"], "connect", *targets.values(), timeout_s=90)
    verdict = {name: found[target] for name, target in targets.items()}
    assert verdict["internet"] == "connected", verdict
    assert verdict["allowed_by_operator"] == "connected", verdict
    for name in ("host", "host_loopback", "rfc1918", "cgnat", "metadata", "neighbour"):
        assert verdict[name] != "connected", (name, verdict)
    assert verdict["denied_by_operator"] != "connected", verdict
    # What arrived where: only what the policy let through.
    time.sleep(0.5)
    reached = {entry["tcp"] for entry in _arrivals(there) if "tcp" in entry}
    assert reached == {WORLD_ADDRESSES["internet"], WORLD_ADDRESSES["allowed_by_operator"]}
    assert _arrivals(here) == []
    # Datagrams too.
    probe(
        api, desktop["id"], "datagram", targets["internet"], targets["rfc1918"], targets["metadata"]
    )
    time.sleep(1)
    datagrams = {entry["udp"] for entry in _arrivals(there) if "udp" in entry}
    assert datagrams == {WORLD_ADDRESSES["internet"]}
    still_answering(api, desktop["id"])
    api.delete(f"/api/desktops/{desktop['id']}")


def test_the_user_mode_network_runs_unprivileged(t_service, inside_t):
    service, client = t_service
    api = Via(inside_t, client)
    desktop = create(api, network=True)
    slirps = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"slirp4netns") and str(service.data_dir).encode() not in argv[0]:
                slirps.append((int(entry.name), os.stat(entry).st_uid))
    ours = [uid for pid, uid in slirps if _descends_from(pid, service.process.pid)]
    assert ours and all(uid != 0 for uid in ours), slirps
    still_answering(api, desktop["id"])
    api.delete(f"/api/desktops/{desktop['id']}")


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(10):
        if pid == ancestor:
            return True
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False
        pid = int(status.split("PPid:")[1].split()[0])
        if pid <= 1:
            return False
    return False


def test_a_desktops_own_egress_rules_narrow_the_policy_while_it_runs(world, inside_t, t_service):
    """Rules given at create, changed while the desktop runs, and never wider than the
    operator's: an allowlist of one address keeps the rest out, a deny list wins, an
    allowed private address stays refused."""
    api = Via(inside_t, t_service[1])
    target = {name: f"{address}:{PORT}" for name, address in WORLD_ADDRESSES.items()}
    denied = create(api, network=True, egress={"deny": [f"{WORLD_ADDRESSES['internet']}/32"]})
    assert denied["egress"]["deny"] == [f"{WORLD_ADDRESSES['internet']}/32"]

    def verdict(*names: str) -> dict[str, str]:
        found = probe(api, denied["id"], "connect", *(target[n] for n in names), timeout_s=90)
        return {name: found[target[name]] for name in names}

    first = verdict("internet", "allowed_by_operator")
    assert first["internet"] != "connected" and first["allowed_by_operator"] == "connected"
    only = {"allow": [f"{WORLD_ADDRESSES['internet']}/32", f"{WORLD_ADDRESSES['rfc1918']}/32"]}
    changed = api.put(f"/api/desktops/{denied['id']}/network", json=only)
    assert changed.status_code == 200, changed.text
    second = verdict("internet", "allowed_by_operator", "rfc1918")
    assert second["internet"] == "connected", second
    assert second["allowed_by_operator"] != "connected", second  # outside its allowlist
    assert second["rfc1918"] != "connected", second  # the operator's block wins
    assert api.put(f"/api/desktops/{denied['id']}/network", json={}).json()["egress"] is None
    assert verdict("allowed_by_operator")["allowed_by_operator"] == "connected"
    # bad asks
    assert api.post("/api/desktops", json={"egress": {"deny": ["10.0.0.0/8"]}}).status_code == 422
    elsewhere = {"network": True, "runtime": "microvm", "egress": {}}
    refused = api.post("/api/desktops", json=elsewhere)  # before any VM boots
    assert refused.status_code == 422 and refused.json()["error"] == "not_supported"
    garbled = api.put(f"/api/desktops/{denied['id']}/network", json={"allow": ["a host"]})
    assert garbled.status_code == 422 and "neither a CIDR" in garbled.text
    offline = create(api)
    assert api.put(f"/api/desktops/{offline['id']}/network", json={}).status_code == 409
    still_answering(api, denied["id"], offline["id"])
    for desktop in (denied, offline):
        api.delete(f"/api/desktops/{desktop['id']}")
