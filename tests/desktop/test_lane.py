"""`FastLane` answers its one route ahead of FastAPI, with the app's error answers."""

from __future__ import annotations

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from desktop.api.errors import install as install_error_handlers
from desktop.api.lane import FastLane
from desktop.errors import DesktopNotFound


async def _endpoint(thing: str, request: Request) -> Response:
    if thing == "missing":
        raise DesktopNotFound("no desktop 'missing'")
    if thing == "broken":
        raise RuntimeError("a bug")
    return Response(b"lane:" + thing.encode() + b":" + await request.body())


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/things/{thing}/poke")
    async def declared(thing: str, request: Request) -> Response:
        return Response(b"route")  # never reached while the lane is there

    @app.get("/things/{thing}/poke")
    async def other_method(thing: str) -> dict[str, str]:
        return {"via": "app"}

    app.add_middleware(FastLane, method="POST", path="/things/{thing}/poke", endpoint=_endpoint)
    return app


async def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t")


async def test_the_lane_answers_its_route_with_the_path_parameters():
    async with await _client() as client:
        response = await client.post("/things/a1/poke", content=b"body")
        assert response.content == b"lane:a1:body"


async def test_other_methods_and_paths_go_to_the_app():
    async with await _client() as client:
        assert (await client.get("/things/a1/poke")).json() == {"via": "app"}
        missing = await client.post("/things/a1/poke/more")
        assert missing.status_code == 404
        assert missing.json()["error"] == "not_found"


async def test_errors_are_answered_as_the_apps_handlers_answer_them():
    async with await _client() as client:
        response = await client.post("/things/missing/poke")
        assert response.status_code == 404
        assert response.json() == {"error": "desktop_not_found", "detail": "no desktop 'missing'"}
        broken = await client.post("/things/broken/poke")
        assert broken.status_code == 500
        assert broken.json()["error"] == "internal_error"
