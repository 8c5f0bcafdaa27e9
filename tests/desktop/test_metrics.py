"""Usage readings: a CPU burn shows in a desktop's metrics as it happens, and stops showing
once the desktop is paused; E2B's `get_metrics` reads the same readings."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from e2b import Sandbox

from tests.conftest import Service, create_desktop, start_service, stop_service, wait_until


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    """A service that reads each desktop's usage twice a second."""
    svc = start_service(CUBICLE_METRICS_INTERVAL_S="0.5", CUBICLE_WARM_POOL="0")
    try:
        yield svc
    finally:
        stop_service(svc)


def _samples(api, desktop_id: str, **params) -> list[dict]:
    answer = api.get(f"/api/desktops/{desktop_id}/metrics", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()["samples"]


def test_a_cpu_burn_shows_as_it_happens_and_stops_when_paused(service):
    with service.client() as api:
        desktop = create_desktop(api, network=True)
        base = f"/api/desktops/{desktop['id']}"
        try:
            burn = "setsid sh -c 'while :; do :; done' >/dev/null 2>&1 &"
            assert api.post(f"{base}/exec", json={"command": burn}).status_code == 200
            burning = wait_until(
                lambda: [s for s in _samples(api, desktop["id"]) if (s["cpu_pct"] or 0) > 50],
                timeout_s=15,
                what="a reading with the loop's CPU",
            )[-1]
            assert burning["memory_bytes"] > 10_000_000 and burning["disk_bytes"] > 0
            assert burning["net_rx_bytes"] is not None  # a desktop with a network
            metrics = api.get(f"{base}/metrics").json()
            assert metrics["memory_limit_bytes"] == 2048 * 1024 * 1024
            assert metrics["interval_s"] == 0.5
            listed = {d["id"]: d for d in api.get("/api/desktops").json()}
            assert listed[desktop["id"]]["usage"]["memory_bytes"] > 0

            assert api.post(f"{base}/pause").status_code == 200
            paused_at = datetime.now(UTC)
            wait_until(
                lambda: len(_samples(api, desktop["id"], start=paused_at.isoformat())) >= 3,
                timeout_s=10,
            )
            later = _samples(api, desktop["id"], start=(paused_at + timedelta(seconds=0.6)))
            assert later and all((s["cpu_pct"] or 0) < 2 for s in later), later
            # the readings carry on through a pause: the metrics route never wakes it
            assert api.get(base).json()["status"] == "paused"
            assert api.post(f"{base}/resume").status_code == 200

            past = datetime.now(UTC) - timedelta(days=1)
            assert _samples(api, desktop["id"], end=past.isoformat()) == []
            assert api.get(f"{base}/metrics", params={"start": "yesterday"}).status_code == 422
            assert api.get("/api/desktops/nope/metrics").status_code == 404
        finally:
            api.delete(base)


def test_e2b_get_metrics_reads_the_same_readings(service, monkeypatch):
    monkeypatch.setenv("E2B_API_URL", service.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", service.url)
    monkeypatch.setenv("E2B_API_KEY", service.token)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("sh -c 'while :; do :; done'", background=True)
        found = wait_until(
            lambda: [m for m in sbx.get_metrics() if m.cpu_used_pct > 25],
            timeout_s=15,
            what="E2B's metrics showing the loop",
        )
        metric = found[-1]
        assert metric.cpu_count >= 1 and metric.mem_total == 2048 * 1024 * 1024
        assert 0 < metric.mem_used < metric.mem_total and metric.disk_total > 0
        latest = Sandbox.get_metrics(sbx.sandbox_id, start=datetime.now(UTC) - timedelta(1))
        assert latest and latest[-1].timestamp >= metric.timestamp
    finally:
        sbx.kill()
