"""Fixtures for agent tests: the scripted OpenAI-compatible model server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agent.fake_model import FakeModelServer


@pytest.fixture(scope="session")
def fake_model_server() -> Iterator[FakeModelServer]:
    """One server for the whole run; use `fake_model` in tests."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def fake_model(fake_model_server: FakeModelServer) -> FakeModelServer:
    """The shared server, with no script and no recorded requests."""
    fake_model_server.reset()
    return fake_model_server
