"""One 1920×1080 desktop with the input probe on it, shared by the executor tests: large
enough that Claude's recommended frame (1429×804) is a real scaling."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cubicle import AsyncDesktop
from tests.conftest import Service
from tests.desktop.tools.probe import Probe

SCREEN = (1920, 1080)


@pytest.fixture(scope="package")
async def big_desktop(service: Service) -> AsyncIterator[AsyncDesktop]:
    d = await AsyncDesktop.create(resolution=SCREEN, base_url=service.url, token=service.token)
    try:
        yield d
    finally:
        await d.kill()


@pytest.fixture(scope="package")
async def probe(big_desktop: AsyncDesktop) -> AsyncIterator[Probe]:
    started = await Probe(big_desktop).start()
    try:
        yield started
    finally:
        await started.stop()


@pytest.fixture
async def focused_probe(probe: Probe) -> Probe:
    """The probe with the keyboard focus back (a test may have opened something over it)."""
    x, y, w, h = probe.area
    await probe.desktop.left_click(x + w - 20, y + h - 20)
    await probe.desktop.wait_for_settle(quiet_ms=100)
    return probe
