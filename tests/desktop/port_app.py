"""A program that listens inside a desktop, for the port-proxy tests: run there with the
service's interpreter (`python -m uvicorn port_app:app`), it answers real HTTP/1.1 with
keep-alive, streams both ways and speaks WebSocket.

- `GET /headers`: the request's headers, as JSON;
- `POST /echo`: the body's length and SHA-256, read as it arrives;
- `GET /stream`: one line, then waits for `GET /release`, then one more line (a proxy that
  held the answer back would never show the first line in time);
- `GET /big?mb=N`: N MiB of a known pattern, with its length;
- WebSocket `/ws`: every message back, with subprotocol `echo.v1` when offered;
  `/ws-refused` is refused (403).
"""

import asyncio
import hashlib
import json

BLOCK = bytes(range(256)) * 4096  # 1 MiB
released = asyncio.Event()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] == "websocket":
        await receive()
        if scope["path"] == "/ws-refused":
            await send({"type": "websocket.close", "code": 1008})  # uvicorn answers 403
            return
        offered = scope.get("subprotocols") or []
        chosen = "echo.v1" if "echo.v1" in offered else None
        await send({"type": "websocket.accept", "subprotocol": chosen})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            reply = {"type": "websocket.send"}
            reply.update({k: message[k] for k in ("bytes", "text") if message.get(k) is not None})
            await send(reply)
    path = scope["path"]
    if path == "/echo":
        digest, length, more = hashlib.sha256(), 0, True
        while more:
            message = await receive()
            digest.update(message.get("body", b""))
            length += len(message.get("body", b""))
            more = message.get("more_body", False)
        await _json(send, {"length": length, "sha256": digest.hexdigest()})
    elif path == "/headers":
        headers = [[k.decode(), v.decode()] for k, v in scope["headers"]]
        await _json(send, {"headers": headers, "query": scope["query_string"].decode()})
    elif path == "/stream":
        released.clear()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        await asyncio.wait_for(released.wait(), 60)
        await send({"type": "http.response.body", "body": b"second\n"})
    elif path == "/release":
        released.set()
        await _json(send, {"released": True})
    elif path == "/big":
        mb = int(scope["query_string"].decode().partition("=")[2] or 1)
        length = str(mb * len(BLOCK)).encode()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
        )
        for _ in range(mb):
            await send({"type": "http.response.body", "body": BLOCK, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    else:
        await _json(send, {"hello": "from inside", "path": path}, 200 if path == "/" else 404)


async def _json(send, value, status=200):
    body = json.dumps(value).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
