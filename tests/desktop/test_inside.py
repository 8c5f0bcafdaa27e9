"""The service's in-process door (`cubicle.server.inside`): rooms reach the API with the SDK
and no token; nothing from outside can pass for them.

The door's own behaviour (timeouts, a caller that leaves) is checked on a small ASGI app in
this process: no desktop is needed for it. The marker is checked against a real service.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import cubicle.server
from cubicle import ServiceUnreachable
from cubicle.client.sdk import AsyncServiceClient
from cubicle.server.inside import INSIDE, URL, InProcessTransport, is_inside
from tests.conftest import Service

SERVER = Path(cubicle.server.__file__).parent


def _app(finished: list[str]) -> Starlette:
    async def whoami(request: Request) -> JSONResponse:
        return JSONResponse({"inside": is_inside(request.scope), "state": request.state.room})

    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(0.3)
        finished.append(request.url.path)
        return JSONResponse({"slept": True})

    return Starlette(routes=[Route("/whoami", whoami), Route("/slow", slow)])


@pytest.mark.fast
def test_a_request_through_the_door_is_marked_and_sees_the_services_state():
    async def main() -> object:
        door = InProcessTransport(_app([]), {"room": "board"})
        async with AsyncServiceClient(base_url=URL, transport=door) as client:
            return await client.request("GET", "/whoami")

    assert asyncio.run(main()) == {"inside": True, "state": "board"}


@pytest.mark.fast
def test_only_the_doors_own_mark_counts():
    assert not is_inside({INSIDE: True})
    assert not is_inside({INSIDE: "cubicle.inside"})
    assert not is_inside({"headers": [(INSIDE.encode(), b"1")]})


@pytest.mark.fast
def test_a_slow_answer_is_a_timeout_as_over_a_socket():
    async def main() -> None:
        door = InProcessTransport(_app([]), {})
        async with AsyncServiceClient(base_url=URL, transport=door, timeout_s=0.05) as client:
            with pytest.raises(ServiceUnreachable, match="did not answer"):
                await client.request("GET", "/slow")

    asyncio.run(main())


@pytest.mark.fast
def test_a_caller_that_leaves_does_not_cut_the_request_short():
    finished: list[str] = []

    async def main() -> None:
        door = InProcessTransport(_app(finished), {})
        async with AsyncServiceClient(base_url=URL, transport=door) as client:
            call = asyncio.create_task(client.request("GET", "/slow"))
            await asyncio.sleep(0.05)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.5)

    asyncio.run(main())
    assert finished == ["/slow"]  # the route ran to its end, as it would for a socket


@pytest.mark.parametrize(
    "headers",
    [
        {INSIDE: "1"},
        {"Cubicle-Inside": "1"},
        {"X-Cubicle-Inside": "true"},
        {INSIDE: "1", "Authorization": "Bearer wrong"},
    ],
)
def test_a_request_from_outside_cannot_pass_as_the_service(service: Service, headers):
    base = service.url
    for method, path in [
        ("GET", "/api/desktops"),
        ("POST", "/api/desktops"),
        ("GET", "/api/tasks"),
        ("GET", "/api/osworld"),
        ("POST", "/mcp"),
    ]:
        answer = httpx.request(method, f"{base}{path}?{INSIDE}=1", headers=headers, json={})
        assert answer.status_code == 401, (method, path, answer.text)


def _reads_the_admin_token(path: Path) -> bool:
    """Whether a module reads `<something>.token` off the services (`services.token`)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "token":
            value = node.value
            if isinstance(value, ast.Name) and value.id == "services":
                return True
    return False


@pytest.mark.fast
def test_only_auth_and_the_start_up_read_the_admin_token():
    modules = sorted(SERVER.rglob("*.py"))
    assert len(modules) > 40  # the whole package was read
    reading = sorted(str(p.relative_to(SERVER)) for p in modules if _reads_the_admin_token(p))
    # auth checks it; the app's start prints it in the link to the pages. No room holds it.
    assert reading == ["api/auth.py", "app.py"]


def _dials(path: Path) -> bool:
    """Whether a module calls anything with `token=` (an SDK client of the service over
    HTTP; a model endpoint's `base_url=` is no call to the service)."""
    return any(
        isinstance(node, ast.Call) and "token" in {k.arg for k in node.keywords}
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
    )


@pytest.mark.fast
def test_no_room_dials_the_service_back():
    rooms = [*(SERVER / "board").rglob("*.py"), *(SERVER / "evals").rglob("*.py")]
    modules = [*rooms, SERVER / "mcp.py"]
    assert len(modules) > 15
    assert [str(p.relative_to(SERVER)) for p in modules if _dials(p)] == []


@pytest.mark.fast
def test_the_check_sees_a_room_that_reads_the_token(tmp_path):
    sample = tmp_path / "room.py"
    sample.write_text("def start(services):\n    return Board(services.token)\n")
    assert _reads_the_admin_token(sample)
    sample.write_text("async def run(t):\n    return await AsyncDesktop.create(token=t)\n")
    assert _dials(sample)
