"""The lean httpx transport against a real uvicorn server on a Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from desktop._transport import LeanTransport, build_request, lean_transport_for, send
from desktop.errors import CubicleError, GuestUnreachable
from desktop.guest_client import GuestClient


async def _echo(request: Request) -> Response:
    body = await request.body()
    return Response(body, headers={"x-method": request.method, "x-query": request.url.query})


async def _slow(request: Request) -> Response:
    await asyncio.sleep(float(request.query_params["s"]))
    return Response(b"late")


async def _pieces(request: Request) -> StreamingResponse:
    async def pieces() -> AsyncIterator[bytes]:
        for index in range(int(request.query_params["n"])):
            yield f"{index}\n".encode() * int(request.query_params.get("size", "1"))
            await asyncio.sleep(0.01)

    return StreamingResponse(pieces())


_APP = Starlette(
    routes=[
        Route("/echo", _echo, methods=["GET", "POST", "PUT", "DELETE"]),
        Route("/slow", _slow, methods=["GET", "POST"]),
        Route("/pieces", _pieces),
    ]
)


@contextlib.asynccontextmanager
async def _server(keep_alive_s: float = 5.0) -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "s.sock")
        config = uvicorn.Config(
            _APP, uds=path, log_level="warning", lifespan="off", timeout_keep_alive=keep_alive_s
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
        try:
            yield path
        finally:
            server.should_exit = True
            await task


def _client(path: str, **kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=LeanTransport(uds=path), base_url="http://guest", **kwargs)


async def test_requests_share_one_keep_alive_connection():
    async with _server() as path, _client(path) as client:
        for index in range(5):
            response = await client.post("/echo", params={"i": index}, json={"i": index})
            assert response.status_code == 200
            assert response.json() == {"i": index}
            assert response.headers["x-query"] == f"i={index}"
        assert (await client.delete("/echo")).headers["x-method"] == "DELETE"
        assert len(client._transport._open) == 1


async def test_large_bodies_arrive_whole_both_ways():
    data = bytes(range(256)) * (24 * 1024)  # 6 MiB: more than the transport buffers
    async with _server() as path, _client(path) as client:
        response = await client.put("/echo", content=data)
        assert response.content == data


async def test_a_streamed_answer_arrives_piece_by_piece():
    async with _server() as path, _client(path) as client:
        async with client.stream("GET", "/pieces", params={"n": 5}) as response:
            lines = [line async for line in response.aiter_lines()]
        assert lines == ["0", "1", "2", "3", "4"]
        # Stopping early closes that connection; the next request gets a fresh one.
        async with client.stream("GET", "/pieces", params={"n": 50, "size": 1000}) as response:
            async for _ in response.aiter_raw():
                break
        assert (await client.get("/echo", params={"after": 1})).status_code == 200


async def test_a_connection_the_server_closed_while_idle_is_replaced():
    async with _server(keep_alive_s=0.1) as path, _client(path) as client:
        assert (await client.post("/echo", content=b"one")).content == b"one"
        await asyncio.sleep(0.5)  # the server closes the idle connection
        assert (await client.post("/echo", content=b"two")).content == b"two"


async def test_timeouts_and_a_missing_socket_raise_httpx_errors():
    async with _server() as path, _client(path, timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/slow", params={"s": 2})
        assert (await client.get("/slow", params={"s": 0})).content == b"late"
    async with _client("/nonexistent/s.sock") as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/echo")


async def test_requests_sent_without_a_client_honour_their_timeout():
    default = httpx.Timeout(5.0)
    async with _server() as path:
        transport = LeanTransport(uds=path)
        try:
            request = build_request("POST", "http://guest/echo", default, json={"a": 1})
            assert (await send(transport, request)).json() == {"a": 1}
            slow = build_request("GET", "http://guest/slow", default, params={"s": 2}, timeout=0.2)
            assert slow.extensions["timeout"]["read"] == 0.2
            with pytest.raises(httpx.ReadTimeout):
                await send(transport, slow)
        finally:
            await transport.aclose()


async def test_post_reads_whole_answers_on_one_connection_and_its_errors_reach_the_caller():
    async with _server(keep_alive_s=0.1) as path:
        transport = LeanTransport(uds=path)
        timeouts = httpx.Timeout(5.0).as_dict()
        try:
            for index in range(3):
                body = b'{"i": %d}' % index
                assert await transport.post("/echo", body, "application/json", timeouts) == (
                    200,
                    body,
                )
            assert len(transport._open) == 1
            await asyncio.sleep(0.5)  # the server closes the idle connection: a new one
            assert (await transport.post("/echo", b"x", "text/plain", timeouts))[1] == b"x"
            status, _ = await transport.post("/nowhere", b"", "application/json", timeouts)
            assert status == 404
            slow = httpx.Timeout(5.0, read=0.2).as_dict()
            with pytest.raises(httpx.ReadTimeout):
                await transport.post("/slow?s=2", b"", "application/json", slow)
        finally:
            await transport.aclose()


async def test_the_guest_client_raises_the_guests_error_from_a_post():
    async with _server() as path:
        guest = GuestClient(path)
        with pytest.raises(CubicleError, match="HTTP 404"):
            await guest.post_json("/nowhere", b"{}")
        assert await guest.post_json("/echo", b'{"a": 1}') == b'{"a": 1}'
    with pytest.raises(GuestUnreachable):
        await GuestClient("/nonexistent/s.sock").post_json("/echo", b"{}")


def test_the_sdk_uses_it_for_plain_http_only(monkeypatch):
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    assert isinstance(lean_transport_for("http://127.0.0.1:8000"), LeanTransport)
    assert lean_transport_for("https://cubicle.example.com") is None
    monkeypatch.setenv("http_proxy", "http://proxy.example.com:3128")
    assert lean_transport_for("http://cubicle.example.com") is None
