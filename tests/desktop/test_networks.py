"""Private networks: desktops on one reach each other by id and alias on any port; a
desktop on no network or on another cannot; nothing of the host is reachable through one.

Real desktops, a real bridge in a network namespace the service owns, real sockets.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import create_desktop, start_service, stop_service, wait_until


def _exec(api: httpx.Client, desktop_id: str, command: str) -> dict:
    answer = api.post(
        f"/api/desktops/{desktop_id}/exec", json={"command": command, "timeout_s": 30}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture(scope="module")
def team(api: httpx.Client) -> Iterator[dict]:
    """Network `team-a` with `web` (serving port 8080) and `client` on it, `loner` on no
    network, and `other` on network `team-b`."""
    for name in ("team-a", "team-b"):
        assert api.post("/api/networks", json={"name": name}).status_code == 201
    desktops = {
        "web": create_desktop(api, networks=["team-a"], alias="web"),
        "client": create_desktop(api, networks=["team-a"]),
        "loner": create_desktop(api),
        "other": create_desktop(api, networks=["team-b"]),
    }
    web = desktops["web"]["id"]
    _exec(
        api,
        web,
        "mkdir -p /tmp/site && echo hello-from-web > /tmp/site/index.html && cd /tmp/site && "
        "(setsid python3 -m http.server 8080 >/dev/null 2>&1 &)",
    )
    wait_until(
        lambda: any(p["port"] == 8080 for p in api.get(f"/api/desktops/{web}/ports").json()),
        20,
        0.2,
        "http.server in the web desktop",
    )
    try:
        yield desktops
    finally:
        for info in desktops.values():
            api.delete(f"/api/desktops/{info['id']}")
        wait_until(lambda: not api.get("/api/networks/team-a").json()["desktops"], 10, 0.1)
        for name in ("team-a", "team-b"):
            api.delete(f"/api/networks/{name}")


def _address(api: httpx.Client, network: str, desktop_id: str) -> str:
    members = api.get(f"/api/networks/{network}").json()["desktops"]
    return next(m["address"] for m in members if m["id"] == desktop_id)


def test_desktops_on_one_network_talk_by_id_and_alias(api, team):
    web, client = team["web"], team["client"]
    assert web["networks"] == ["team-a"]
    by_alias = _exec(api, client["id"], "curl -sS -m 5 http://web:8080/")
    by_id = _exec(api, client["id"], f"curl -sS -m 5 http://{web['id']}:8080/")
    assert by_alias["stdout"] == by_id["stdout"] == "hello-from-web\n", (by_alias, by_id)
    # and back, on any port: a listener the client opens, reached from web by the id
    listen = (
        "import socket; c, _ = socket.create_server(('0.0.0.0', 9000)).accept(); c.sendall(b'pong')"
    )
    _exec(api, client["id"], f'(setsid python3 -c "{listen}" &)')
    wait_until(
        lambda: any(
            p["port"] == 9000 for p in api.get(f"/api/desktops/{client['id']}/ports").json()
        ),
        10,
        0.1,
    )
    dial = f"import socket; print(socket.create_connection(('{client['id']}', 9000), 5).recv(4))"
    back = _exec(api, web["id"], f'python3 -c "{dial}"')
    assert back["stdout"].strip() == "b'pong'", back


def test_a_desktop_on_no_network_or_another_cannot_reach_them(api, team):
    address = _address(api, "team-a", team["web"]["id"])
    for outsider in ("loner", "other"):
        probe = _exec(api, team[outsider]["id"], f"curl -sS -m 3 http://{address}:8080/")
        assert probe["exit_code"] != 0 and "hello" not in probe["stdout"], (outsider, probe)
        by_name = _exec(api, team[outsider]["id"], "curl -sS -m 3 http://web:8080/")
        assert by_name["exit_code"] != 0, (outsider, by_name)
    assert api.get("/healthz").status_code == 200


def _host_address() -> str:
    """An address of this host that is not loopback (the service listens on all)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # picks the outgoing interface; sends nothing
        return probe.getsockname()[0]


def test_a_network_reaches_nothing_of_the_host(api, team, service):
    """From a desktop on a network: not the service (on the host's own address), not the
    network's gateway address, not the host's loopback (its own is its own)."""
    port = service.url.rsplit(":", 1)[1]
    host = _host_address()
    for target in (f"{host}:{port}", "10.213.0.1:80"):
        probe = _exec(api, team["client"]["id"], f"curl -sS -m 3 http://{target}/healthz")
        assert probe["exit_code"] != 0, (target, probe)
    assert api.get("/healthz").status_code == 200


def test_hosts_files_follow_who_is_on_the_network(api, team):
    hosts = _exec(api, team["client"]["id"], "cat /etc/hosts")["stdout"]
    assert f"{team['web']['id']} web" in hosts and team["loner"]["id"] not in hosts
    late = create_desktop(api, networks=["team-a"], alias="late")
    try:
        wait_until(
            lambda: "late" in _exec(api, team["client"]["id"], "cat /etc/hosts")["stdout"], 5
        )
        reached = _exec(api, late["id"], "curl -sS -m 5 http://web:8080/")
        assert reached["stdout"] == "hello-from-web\n", reached
    finally:
        api.delete(f"/api/desktops/{late['id']}")
    wait_until(
        lambda: "late" not in _exec(api, team["client"]["id"], "cat /etc/hosts")["stdout"], 5
    )
    members = [m["id"] for m in api.get("/api/networks/team-a").json()["desktops"]]
    assert late["id"] not in members


def test_bad_network_requests_are_refused_clearly(api, team):
    def create(**body) -> httpx.Response:
        return api.post("/api/desktops", json=body)

    assert create(networks=["nope"]).status_code == 404
    assert create(alias="lonely").status_code == 422
    assert create(networks=["team-a"], alias="web").status_code == 409  # taken
    assert create(networks=["Team A"]).status_code == 422
    refused = create(networks=["team-a"], runtime="microvm")
    assert refused.status_code == 422 and refused.json()["error"] == "not_supported"
    assert api.post("/api/networks", json={"name": "team-a"}).status_code == 409
    assert api.post("/api/networks", json={"name": "-bad"}).status_code == 422
    busy = api.delete("/api/networks/team-a")
    assert busy.status_code == 409 and team["web"]["id"] in busy.json()["detail"]
    assert api.get("/api/networks/nope").status_code == 404


def test_a_service_removes_its_network_namespaces_when_it_stops():
    svc = start_service(CUBICLE_WARM_POOL="0")
    try:
        with svc.client() as client:
            assert client.post("/api/networks", json={"name": "brief"}).status_code == 201
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "-brief" in listed
    finally:
        stop_service(svc)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "-brief" not in listed
