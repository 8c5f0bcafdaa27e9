"""The guest's code-context routes: `POST /code` (NDJSON events) and `/contexts`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from cubicle.guest.code.kernels import Contexts
from cubicle.guest.web import answer, body
from cubicle.protocol.code import ContextInfo, CreateContext, RunCode, event_line
from cubicle.protocol.routes import GuestPath

_infos = TypeAdapter(list[ContextInfo])


def code_routes(contexts: Callable[[], Contexts]) -> list[Route]:
    """Routes over the desktop's contexts (`contexts()` is called on each request, so
    kernels start only when code first runs)."""

    async def run_code(request: Request) -> Response:
        run = await body(request, RunCode)
        context = await contexts().for_run(run)  # an unknown context or language: 4xx

        async def lines():
            # Closed at once when the caller goes away: the run is interrupted and the
            # context's lock let go, not left to the garbage collector.
            async with contextlib.aclosing(context.run(run)) as events:
                async for event in events:
                    yield event_line(event)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def create(request: Request) -> Response:
        context = await contexts().create(await body(request, CreateContext))
        return answer(context.info(), 201)

    async def list_all(request: Request) -> Response:
        return Response(_infos.dump_json(contexts().list()), media_type="application/json")

    async def restart(request: Request) -> Response:
        return answer(await contexts().restart(request.path_params["context_id"]))

    async def interrupt(request: Request) -> Response:
        await contexts().interrupt(request.path_params["context_id"])
        return Response(status_code=204)

    async def remove(request: Request) -> Response:
        await contexts().remove(request.path_params["context_id"])
        return Response(status_code=204)

    return [
        Route(GuestPath.CODE, run_code, methods=["POST"]),
        Route(GuestPath.CONTEXTS, create, methods=["POST"]),
        Route(GuestPath.CONTEXTS, list_all, methods=["GET"]),
        Route(GuestPath.CONTEXT_RESTART, restart, methods=["POST"]),
        Route(GuestPath.CONTEXT_INTERRUPT, interrupt, methods=["POST"]),
        Route(GuestPath.CONTEXT, remove, methods=["DELETE"]),
    ]
