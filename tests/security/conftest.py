"""The escape suite's desktops: a `victim` with small limits, and a `neighbour`.

Both belong to the session's service, whoever runs the suite: root, or the dedicated
non-root user `test_nonroot.py` runs it as (`-m "not root_only"`).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.security.attack import create

VICTIM = {"memory_mb": 768, "max_pids": 256, "disk_mb": 256}
"""Small enough that each bomb reaches its limit in seconds."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "root_only: needs root (netns, other users, QEMU)")


@pytest.fixture(scope="module")
def victim(api: httpx.Client) -> Iterator[dict]:
    info = create(api, **VICTIM)
    yield info
    api.delete(f"/api/desktops/{info['id']}")


@pytest.fixture(scope="module")
def neighbour(api: httpx.Client) -> Iterator[dict]:
    info = create(api)
    yield info
    api.delete(f"/api/desktops/{info['id']}")
