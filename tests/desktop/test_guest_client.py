"""`GuestClient` (the lean HTTP/1.1 pool) against a real uvicorn server: Unix socket and TCP."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from cubicle.guest.app import RequireSecret
from cubicle.guest.relay import SecretCheck
from cubicle.protocol.errors import AuthError, CubicleError, GuestUnreachable, NotFound
from cubicle.protocol.routes import GuestPath, window_op_path
from cubicle.server.guest_client import GuestClient, GuestEndpoint

pytestmark = pytest.mark.fast


async def _echo(request: Request) -> Response:
    body = await request.body()
    headers = {"x-method": request.method, "x-query": request.url.query}
    return Response(body, headers=headers, media_type=request.headers.get("content-type"))


async def _missing(request: Request) -> Response:
    body = b'{"error": "file_not_found", "detail": "no such file: ~/x"}'
    return Response(body, 404, media_type="application/json")


async def _window_op(request: Request) -> Response:
    return Response(f"{request.path_params['window_id']} {request.path_params['op']}".encode())


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
        Route("/missing", _missing),
        Route(GuestPath.WINDOW_OP, _window_op, methods=["POST"]),
        Route(GuestPath.FRAMES_STATS, _echo, methods=["GET"]),
    ]
)


@contextlib.asynccontextmanager
async def _serve(config: uvicorn.Config) -> AsyncIterator[uvicorn.Server]:
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn has no event
        await asyncio.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def _server(keep_alive_s: float = 5.0) -> AsyncIterator[str]:
    """A server on a Unix socket; yields its path."""
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "s.sock")
        config = uvicorn.Config(
            _APP, uds=path, log_level="warning", lifespan="off", timeout_keep_alive=keep_alive_s
        )
        async with _serve(config):
            yield path


@contextlib.asynccontextmanager
async def _client(path: str, **kwargs) -> AsyncIterator[GuestClient]:
    client = GuestClient(GuestEndpoint(uds=path), **kwargs)
    try:
        yield client
    finally:
        await client.close()


async def test_requests_share_one_keep_alive_connection():
    async with _server() as path, _client(path) as client:
        for index in range(5):
            answer = await client.request(
                "POST", "/echo", params={"i": index, "on": True}, content=b"%d" % index
            )
            assert answer.status == 200 and answer.content == b"%d" % index
            assert answer.headers["x-query"] == f"i={index}&on=true"
        assert (await client.request("DELETE", "/echo")).headers["x-method"] == "DELETE"
        assert len(client._pool._open) == 1


async def test_a_guest_path_served_by_its_constant_is_reached_by_it():
    async with _server() as path, _client(path) as client:
        assert (await client.request("GET", GuestPath.FRAMES_STATS)).headers["x-method"] == "GET"
        answer = await client.request("POST", window_op_path(12, "close"))
        assert answer.content == b"12 close"


async def test_large_bodies_arrive_whole_both_ways():
    data = bytes(range(256)) * (24 * 1024)  # 6 MiB: more than the pool buffers
    async with _server() as path, _client(path) as client:
        assert (await client.request("PUT", "/echo", content=data)).content == data


async def test_a_streamed_answer_arrives_piece_by_piece():
    async with _server() as path, _client(path) as client:
        async with client.stream("GET", "/pieces", params={"n": 5}, read_timeout_s=5) as answer:
            text = b"".join([chunk async for chunk in answer.chunks()])
        assert text.split() == [b"0", b"1", b"2", b"3", b"4"]
        # Stopping early closes that connection; the next request gets a fresh one.
        async with client.stream(
            "GET", "/pieces", params={"n": 50, "size": 1000}, read_timeout_s=5
        ) as answer:
            async for _ in answer.chunks():
                break
        assert (await client.request("GET", "/echo", params={"after": 1})).status == 200


async def test_a_connection_the_server_closed_while_idle_is_replaced():
    async with _server(keep_alive_s=0.1) as path, _client(path) as client:
        assert (await client.request("POST", "/echo", content=b"one")).content == b"one"
        await asyncio.sleep(0.5)  # the server closes the idle connection
        assert (await client.request("POST", "/echo", content=b"two")).content == b"two"


async def test_timeouts_and_a_missing_socket_are_guest_unreachable():
    async with _server() as path, _client(path, timeout_s=0.2) as client:
        with pytest.raises(GuestUnreachable, match="did not answer"):
            await client.request("GET", "/slow", params={"s": 2})
        assert (await client.request("GET", "/slow", params={"s": 0})).content == b"late"
        answer = await client.request("GET", "/slow", params={"s": 0.3}, timeout_s=2)
        assert answer.content == b"late"
    async with _client("/nonexistent/s.sock") as client:
        with pytest.raises(GuestUnreachable, match=r"unix:/nonexistent/s\.sock"):
            await client.request("GET", "/echo")


async def test_the_guests_errors_come_back_as_their_own_class():
    async with _server() as path, _client(path) as client:
        with pytest.raises(NotFound, match="no such file") as raised:
            await client.request("GET", "/missing")
        assert raised.value.code == "file_not_found" and raised.value.status_code == 404
        with pytest.raises(CubicleError, match="HTTP 404"):  # not an ErrorBody: still raised
            await client.request("GET", "/nowhere")


async def test_over_tcp_only_the_holder_of_the_secret_is_answered():
    config = uvicorn.Config(
        RequireSecret(_APP, SecretCheck("s3cret")), host="127.0.0.1", port=0, log_level="warning",
        lifespan="off",
    )  # fmt: skip
    async with _serve(config) as server:
        port = server.servers[0].sockets[0].getsockname()[1]
        endpoint = GuestEndpoint(host="127.0.0.1", port=port, secret="s3cret")
        client = GuestClient(endpoint)
        stranger = GuestClient(GuestEndpoint(host="127.0.0.1", port=port, secret="guess"))
        try:
            assert (await client.request("POST", "/echo", content=b"hi")).content == b"hi"
            with pytest.raises(AuthError, match="answers its runtime only"):
                await stranger.request("POST", "/echo", content=b"hi")
            assert (await client.request("GET", "/echo")).status == 200  # still answering
        finally:
            await client.close()
            await stranger.close()


def test_an_endpoint_is_a_socket_or_a_host_and_port():
    assert str(GuestEndpoint(uds="/run/g.sock")) == "unix:/run/g.sock"
    assert str(GuestEndpoint(host="10.0.0.2", port=8300, secret="x")) == "tcp:10.0.0.2:8300"
    with pytest.raises(ValueError, match="not both"):
        GuestEndpoint(uds="/run/g.sock", host="10.0.0.2", port=8300)
    with pytest.raises(ValueError, match="not both"):
        GuestEndpoint()
