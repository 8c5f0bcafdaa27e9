"""The escape suite's desktops: a `victim` with small limits, and a `neighbour`.

Both belong to the session's service, whoever runs the suite: root, or the dedicated
non-root user `test_nonroot.py` runs it as (`-m "not root_only"`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from tests.security.attack import create

VICTIM = {"memory_mb": 768, "max_pids": 256, "disk_mb": 256}
"""Small enough that each bomb reaches its limit in seconds."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root: test_nonroot.py runs the rest as a user")
        for item in items:
            if "root_only" in item.keywords:
                item.add_marker(skip)


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
