"""E2B's control plane (its `spec/openapi.yml`), on the service's own port.

A sandbox is a Cubicle desktop. Create maps E2B's body to `CreateDesktop` (`timeout` is
the desktop's idle timeout, which each call refreshes: a sandbox lives at least as long
as E2B's would); `envVars` go to every process envd starts; `allow_internet_access`
(default true, as on E2B) is `network`. Answers carry `domain`, so `get_host` points at
this service. Errors are E2B's shape, `{"code": status, "message": why}`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from cubicle.protocol.errors import (
    AuthError,
    Conflict,
    CubicleError,
    DesktopNotFound,
    InvalidRequest,
    NotFound,
    NotSupported,
    answer_for,
    describe_validation,
    from_code,
    status_for,
)
from cubicle.protocol.service import (
    SNAPSHOT_NAME,
    CreateDesktop,
    DesktopInfo,
    DesktopMetrics,
    Lifecycle,
    SnapshotInfo,
    UsageSample,
    snapshot_name,
)
from cubicle.server.api.auth import is_admin_token
from cubicle.server.api.deps import ServicesDep
from cubicle.server.e2b import CLIENT_ID, ENVD_VERSION, TEMPLATES, Sandbox
from cubicle.server.services import Services

E2B_TIMEOUT_S = 300
DESKTOP_SCREEN = (1024, 768)
"""The screen of a sandbox of template `desktop`: E2B Desktop's default resolution."""
"""E2B's default sandbox timeout."""


class _E2bRoute(APIRoute):
    """Errors in E2B's shape, which its SDKs read."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except CubicleError as exc:
                answer = answer_for(exc, log_hint="the service's log")
                body = {"code": answer.status, "message": answer.body.detail}
                return JSONResponse(body, answer.status, headers=answer.headers)
            except RequestValidationError as exc:
                message = describe_validation(exc.errors())
                return JSONResponse({"code": 400, "message": message}, 400)

        return handle


router = APIRouter(route_class=_E2bRoute, include_in_schema=False)
"""E2B's routes, in E2B's shapes: its own OpenAPI spec describes them, not Cubicle's."""


class AutoResume(BaseModel):
    model_config = ConfigDict(extra="allow")

    enabled: bool = False
    """Resume a paused sandbox when it is used (its envd, its ports)."""


class NewSandbox(BaseModel):
    """E2B's `NewSandbox` body; what Cubicle cannot honour is refused by name."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    templateID: Annotated[str, Field(min_length=1, max_length=128)]
    timeout: Annotated[int, Field(ge=0, le=86_400)] = E2B_TIMEOUT_S
    metadata: dict[str, str] = {}
    envVars: dict[str, str] = {}
    secure: bool = True
    allow_internet_access: bool = True
    autoPause: bool = False
    """Pause at the timeout instead of killing (E2B's `lifecycle={"on_timeout": "pause"}`)."""
    autoPauseMemory: bool = True
    autoResume: AutoResume | None = None


class Timeout(BaseModel):
    timeout: Annotated[int, Field(ge=0, le=86_400)]


class Connect(BaseModel):
    """Body of E2B's connect: the timeout from now (E2B's default when absent)."""

    model_config = ConfigDict(extra="allow")

    timeout: Annotated[int, Field(ge=0, le=86_400)] = E2B_TIMEOUT_S


_REFUSED = {
    "network": "network rules (use Cubicle's egress rules: PUT /api/desktops/{id}/network)",
    "volumeMounts": "volumes",
    "mcp": "the MCP gateway",
    "iam": "IAM roles",
}


def _key(services: Services, api_key: str | None, authorization: str | None) -> None:
    token = api_key or (authorization or "").removeprefix("Bearer ").strip()
    if not token or not is_admin_token(services, token):
        raise AuthError("E2B's X-API-KEY must be this service's token")


ApiKey = Annotated[str | None, Header(alias="X-API-KEY")]
Bearer = Annotated[str | None, Header(alias="Authorization")]


def _template(services: Services, requested: str) -> tuple[str, SnapshotInfo | None]:
    """The template a sandbox is made from: a built-in name, or a snapshot's id (E2B's
    `Sandbox.create(snapshot_id)`), with that snapshot."""
    name = requested.split(":", 1)[0]
    if name in TEMPLATES:
        return name, None
    for saved in services.manager.snapshots():
        if saved.name == name:
            return name, saved
    raise NotSupported(
        f"template {requested!r}: Cubicle starts its built-in desktop for "
        f"{', '.join(TEMPLATES)}, or a snapshot by its id; custom templates are not built yet"
    )


def _timeout(seconds: int) -> int:
    return max(10, seconds)


def _sandbox_body(services: Services, sandbox: Sandbox) -> dict[str, Any]:
    return {
        "sandboxID": sandbox.sandbox_id,
        "templateID": sandbox.template,
        "alias": sandbox.template,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.access_token,
        "trafficAccessToken": sandbox.access_token,
        "domain": services.settings.port_domain,
    }


def _detail(services: Services, sandbox: Sandbox, info: DesktopInfo) -> dict[str, Any]:
    settings = services.settings
    return {
        **_sandbox_body(services, sandbox),
        "startedAt": sandbox.started_at.isoformat(),
        "endAt": sandbox.end_at.isoformat(),
        "cpuCount": _cpu_count(services),
        "memoryMB": settings.memory_mb,
        "diskSizeMB": settings.disk_mb,
        "state": _STATES[info.status],
        "metadata": sandbox.metadata,
        "allowInternetAccess": info.network,
    }


_STATES = {"ready": "running", "paused": "paused"}
"""E2B's state of a sandbox by its desktop's status; other statuses do not exist for E2B."""


def _found(services: Services, sandbox_id: str) -> tuple[Sandbox, DesktopInfo]:
    """A sandbox that runs or is paused."""
    sandbox = services.e2b.get(sandbox_id)
    if sandbox is None:
        raise DesktopNotFound(f"sandbox {sandbox_id} was not found")
    info = services.manager.get(sandbox_id)
    if info.status not in _STATES:
        raise DesktopNotFound(f"sandbox {sandbox_id} was not found ({info.status})")
    return sandbox, info


def _running(services: Services, sandbox_id: str) -> tuple[Sandbox, DesktopInfo]:
    sandbox, info = _found(services, sandbox_id)
    if info.status == "paused":
        raise Conflict(f"sandbox {sandbox_id} is paused: connect to it to resume it")
    return sandbox, info


async def _create(services: Services, body: NewSandbox) -> JSONResponse:
    extra = body.model_extra or {}
    for name, what in _REFUSED.items():
        if extra.get(name):
            raise NotSupported(f"{name}: Cubicle does not offer {what} through E2B's API yet")
    template, snapshot = _template(services, body.templateID)
    timeout_s = _timeout(body.timeout)
    lifecycle = Lifecycle(
        on_timeout="pause" if body.autoPause else "kill",
        keep_memory=body.autoPauseMemory,
        auto_resume=body.autoResume is not None and body.autoResume.enabled,
    )
    # E2B Desktop's screen for its template (the SDK's `resolution` goes to an Xvfb of
    # its own, which a Cubicle desktop already runs: see docs/e2b.md)
    screen = {"resolution": DESKTOP_SCREEN} if template == "desktop" else {}
    request = CreateDesktop(
        **screen,
        timeout_s=timeout_s,
        network=body.allow_internet_access,
        lifecycle=lifecycle,
        snapshot=snapshot.name if snapshot is not None else None,
        runtime=snapshot.runtime if snapshot is not None else None,
    )
    if snapshot is None:
        # E2B's sandboxes have the internet by default, the pool's default spares do not:
        # keep the operator's margin of spares of the kind E2B clients ask for.
        services.manager.want_warm("e2b", services.settings.warm_pool, request)
    info = await services.manager.create(request)
    sandbox = services.e2b.add(info.id, template, timeout_s, body.metadata, body.envVars)
    return JSONResponse(_sandbox_body(services, sandbox), status_code=201)


@router.post("/v2/sandboxes", status_code=201)
@router.post("/sandboxes", status_code=201)  # as SDKs up to 2.45 call it
async def create_sandbox(
    body: NewSandbox, services: ServicesDep, key: ApiKey = None, bearer: Bearer = None
) -> JSONResponse:
    """E2B's create: a Cubicle desktop, answered as a sandbox."""
    _key(services, key, bearer)
    return await _create(services, body)


def _listed(
    services: Services, metadata: str | None, state: list[str] | None
) -> list[dict[str, Any]]:
    wanted = dict(parse_qsl(metadata or ""))
    # `state=running&state=paused`, as the SDKs send it, or `state=running,paused`
    states = {name for value in state or ["running,paused"] for name in value.split(",")}
    found = []
    for sandbox in services.e2b.all():
        try:
            _, info = _found(services, sandbox.sandbox_id)
        except CubicleError:
            continue
        if _STATES[info.status] not in states:
            continue
        if any(sandbox.metadata.get(k) != v for k, v in wanted.items()):
            continue
        found.append(_detail(services, sandbox, info))
    return sorted(found, key=lambda item: item["startedAt"])


@router.get("/v2/sandboxes")
async def list_v2(
    services: ServicesDep,
    response: Response,
    key: ApiKey = None,
    bearer: Bearer = None,
    metadata: str | None = None,
    state: Annotated[list[str] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    nextToken: str | None = None,
) -> list[dict[str, Any]]:
    """Running and paused sandboxes (`state`, `metadata` filters), a page at a time: the
    next page's token is in `x-next-token`."""
    _key(services, key, bearer)
    return _page(_listed(services, metadata, state), "sandboxID", limit, nextToken, response)


def _page(
    listed: list[dict[str, Any]], key: str, limit: int, token: str | None, response: Response
) -> list[dict[str, Any]]:
    """One page of `listed`, from the item whose `key` is `token`; the next page's token
    (the key of its first item) in `x-next-token`, as E2B's paginators read it."""
    start = 0
    if token:
        keys = [item[key] for item in listed]
        if token not in keys:
            raise InvalidRequest("nextToken is not a page of this listing")
        start = keys.index(token)
    if start + limit < len(listed):
        response.headers["x-next-token"] = listed[start + limit][key]
    return listed[start : start + limit]


@router.get("/sandboxes")
async def list_v1(
    services: ServicesDep, key: ApiKey = None, bearer: Bearer = None, metadata: str | None = None
) -> list[dict[str, Any]]:
    _key(services, key, bearer)
    return _listed(services, metadata, None)


@router.get("/sandboxes/metrics")
async def sandboxes_metrics(
    services: ServicesDep,
    key: ApiKey = None,
    bearer: Bearer = None,
    sandbox_ids: Annotated[str, Query(max_length=10_000)] = "",
) -> dict[str, Any]:
    """The latest reading of each sandbox named (those not running or paused: left out).
    Before `/sandboxes/{sandbox_id}`, which would take `metrics` for an id."""
    _key(services, key, bearer)
    found: dict[str, Any] = {}
    for sandbox_id in filter(None, sandbox_ids.split(",")):
        try:
            _found(services, sandbox_id)
        except CubicleError:
            continue
        limits = services.manager.metrics_of(sandbox_id)
        if limits.samples:
            found[sandbox_id] = _metric(services, limits.samples[-1], limits)
    return {"sandboxes": found}


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(
    sandbox_id: str, services: ServicesDep, key: ApiKey = None, bearer: Bearer = None
) -> dict[str, Any]:
    _key(services, key, bearer)
    sandbox, info = _found(services, sandbox_id)
    return _detail(services, sandbox, info)


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill_sandbox(
    sandbox_id: str, services: ServicesDep, key: ApiKey = None, bearer: Bearer = None
) -> Response:
    _key(services, key, bearer)
    _found(services, sandbox_id)
    await services.manager.kill(sandbox_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(
    sandbox_id: str,
    body: Timeout,
    services: ServicesDep,
    key: ApiKey = None,
    bearer: Bearer = None,
) -> Response:
    """From now, `timeout` seconds (Cubicle's idle timeout: calls keep it alive longer)."""
    _key(services, key, bearer)
    _extend(services, sandbox_id, body.timeout, shorten=True)
    return Response(status_code=204)


def _extend(services: Services, sandbox_id: str, timeout: int, *, shorten: bool) -> Sandbox:
    """The running sandbox, its idle timeout `timeout` seconds from now (at least 10);
    `shorten=False` never brings its end nearer (connect)."""
    sandbox, _ = _running(services, sandbox_id)
    seconds = _timeout(timeout)
    services.manager.extend(sandbox_id, seconds)
    end = datetime.now(UTC) + timedelta(seconds=seconds)
    sandbox.end_at = end if shorten else max(sandbox.end_at, end)
    return sandbox


@router.post("/v2/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/connect")
async def connect_sandbox(
    sandbox_id: str,
    body: Connect,
    services: ServicesDep,
    key: ApiKey = None,
    bearer: Bearer = None,
) -> JSONResponse:
    """Connect to a sandbox and extend its timeout: 200 if it was running, 201 if it was
    paused and is resumed."""
    _key(services, key, bearer)
    _, info = _found(services, sandbox_id)
    resumed = info.status == "paused"
    if resumed:
        await services.manager.resume(sandbox_id)
    sandbox = _extend(services, sandbox_id, body.timeout, shorten=False)
    return JSONResponse(_sandbox_body(services, sandbox), status_code=201 if resumed else 200)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
async def resume_sandbox(
    sandbox_id: str,
    body: Connect,
    services: ServicesDep,
    key: ApiKey = None,
    bearer: Bearer = None,
) -> dict[str, Any]:
    """E2B's older resume: 409 unless paused, then as connect."""
    _key(services, key, bearer)
    _, info = _found(services, sandbox_id)
    if info.status != "paused":
        raise Conflict(f"sandbox {sandbox_id} is not paused")
    await services.manager.resume(sandbox_id)
    return _sandbox_body(services, _extend(services, sandbox_id, body.timeout, shorten=False))


class Fork(BaseModel):
    """Body of E2B's fork."""

    model_config = ConfigDict(extra="allow")

    count: Annotated[int, Field(ge=1, le=16)] = 1
    timeout: Annotated[int, Field(ge=0, le=86_400)] | None = None


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork_sandbox(
    sandbox_id: str,
    body: Fork,
    services: ServicesDep,
    key: ApiKey = None,
    bearer: Bearer = None,
) -> list[dict[str, Any]]:
    """`count` sandboxes starting from this one as it is now, memory included (microVM
    desktops; a local desktop forks its disk only, so E2B's fork is refused there), each
    with the parent's template, metadata and envs; one result each, in order."""
    _key(services, key, bearer)
    parent, info = _found(services, sandbox_id)
    if not services.manager.runtime(info.runtime).snapshots_memory:
        raise NotSupported(
            f"fork: E2B's forks keep the sandbox's memory, and {info.runtime} desktops fork "
            "their disk only (programs start afresh): fork with Cubicle's API "
            f"(POST /api/desktops/{sandbox_id}/fork) to get that, or use the microvm runtime"
        )
    forked = await services.manager.fork(sandbox_id, body.count)
    timeout_s = _timeout(body.timeout) if body.timeout is not None else None
    results: list[dict[str, Any]] = [{} for _ in range(body.count)]
    made = iter(forked.desktops)
    failed = {error.index: error for error in forked.errors}
    for index in range(body.count):
        if (error := failed.get(index)) is not None:
            status = status_for(from_code(error.error, error.detail))
            results[index] = {"error": {"code": status, "message": error.detail}}
            continue
        child = next(made)
        seconds = timeout_s or int((parent.end_at - parent.started_at).total_seconds())
        services.manager.extend(child.id, seconds)
        sandbox = services.e2b.add(child.id, parent.template, seconds, parent.metadata, parent.env)
        results[index] = {"sandbox": _sandbox_body(services, sandbox)}
    return results


class Pause(BaseModel):
    """Body of E2B's pause."""

    model_config = ConfigDict(extra="allow")

    memory: bool = True
    """Keep the memory (E2B's `mode="full"`); False is a filesystem-only pause."""


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause_sandbox(
    sandbox_id: str,
    services: ServicesDep,
    body: Pause | None = None,
    key: ApiKey = None,
    bearer: Bearer = None,
) -> Response:
    """Pause with its memory (E2B's `mode="full"`, the default) or its disk only
    (`"filesystem"`: the sandbox boots again on connect); 409 if paused already."""
    _key(services, key, bearer)
    _found(services, sandbox_id)
    await services.manager.pause(sandbox_id, keep_memory=(body or Pause()).memory)
    return Response(status_code=204)


def _cpu_count(services: Services) -> int:
    return max(1, int(services.settings.cpu_cores or 1))


def _metric(services: Services, sample: UsageSample, limits: DesktopMetrics) -> dict[str, Any]:
    """One of Cubicle's readings in E2B's `SandboxMetric` shape."""
    cpus = _cpu_count(services)
    return {
        "timestamp": sample.at.isoformat(),
        "timestampUnix": int(sample.at.timestamp()),
        "cpuCount": cpus,
        "cpuUsedPct": round((sample.cpu_pct or 0.0) / cpus, 2),
        "memUsed": sample.memory_bytes - sample.memory_cache_bytes,
        "memTotal": limits.memory_limit_bytes,
        "memCache": sample.memory_cache_bytes,
        "diskUsed": sample.disk_bytes or 0,
        "diskTotal": limits.disk_limit_bytes,
    }


def _unix(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


@router.get("/sandboxes/{sandbox_id}/metrics")
async def sandbox_metrics(
    sandbox_id: str,
    services: ServicesDep,
    key: ApiKey = None,
    bearer: Bearer = None,
    start: Annotated[int | None, Query(ge=0)] = None,
    end: Annotated[int | None, Query(ge=0)] = None,
) -> list[dict[str, Any]]:
    """Its readings (one every `CUBICLE_METRICS_INTERVAL_S`) from `start` to `end`, Unix
    seconds, in E2B's shape."""
    _key(services, key, bearer)
    _found(services, sandbox_id)
    readings = services.manager.metrics_of(sandbox_id, _unix(start), _unix(end))
    return [_metric(services, sample, readings) for sample in readings.samples]


class NewSnapshot(BaseModel):
    """Body of E2B's `create_snapshot`."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    memory: bool = True
    """E2B's `mode="full"` (its default); False is `"filesystem"`."""


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def snapshot_sandbox(
    sandbox_id: str,
    services: ServicesDep,
    body: NewSnapshot | None = None,
    key: ApiKey = None,
    bearer: Bearer = None,
) -> dict[str, Any]:
    """A named snapshot of the sandbox as it is now (Cubicle's `POST …/snapshot`), its
    name the id `Sandbox.create` takes. E2B's two modes are honoured where the runtime
    keeps exactly that: `full` (memory) on microVM desktops, `filesystem` on local ones."""
    _key(services, key, bearer)
    _, info = _found(services, sandbox_id)
    wanted = body or NewSnapshot()
    keeps_memory = services.manager.runtime(info.runtime).snapshots_memory
    if wanted.memory and not keeps_memory:
        raise NotSupported(
            f"create_snapshot: {info.runtime} desktops snapshot their filesystem only "
            '(sandboxes made from it boot afresh): pass mode="filesystem", or use the '
            "microvm runtime for a snapshot with memory"
        )
    if not wanted.memory and keeps_memory:
        raise NotSupported(
            f'create_snapshot: mode="filesystem" is not built for {info.runtime} desktops, '
            'whose snapshots keep memory: pass mode="full"'
        )
    name = wanted.name or f"snapshot-{sandbox_id}-{secrets.token_hex(3)}"
    saved = await services.manager.snapshot(sandbox_id, snapshot_name(name))
    return {"snapshotID": saved.name, "names": [saved.name]}


@router.get("/snapshots")
async def list_snapshots(
    services: ServicesDep,
    response: Response,
    key: ApiKey = None,
    bearer: Bearer = None,
    sandboxID: str | None = None,
    name: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    nextToken: str | None = None,
) -> list[dict[str, Any]]:
    """Snapshots, of one sandbox (`sandboxID`) or by name, a page at a time."""
    _key(services, key, bearer)
    wanted = name.split(":", 1)[0] if name else None
    listed = [
        {"snapshotID": saved.name, "names": [saved.name]}
        for saved in services.manager.snapshots()
        if (sandboxID is None or saved.parent == sandboxID)
        and (wanted is None or saved.name == wanted)
        and not saved.name.startswith("fork-")  # a fork's own, while its children need it
    ]
    return _page(listed, "snapshotID", limit, nextToken, response)


@router.delete("/templates/{template_id}", status_code=204)
async def delete_snapshot(
    template_id: str, services: ServicesDep, key: ApiKey = None, bearer: Bearer = None
) -> Response:
    """Delete a snapshot (E2B's `delete_snapshot`); 404 for any other template."""
    _key(services, key, bearer)
    name = template_id.split(":", 1)[0]
    if name in TEMPLATES or not SNAPSHOT_NAME.match(name):
        raise NotFound(f"template {template_id!r} is not a snapshot")
    await services.manager.delete_snapshot(name)
    return Response(status_code=204)


def _missing(what: str) -> Callable[..., Coroutine[Any, Any, Response]]:
    async def refuse(services: ServicesDep, key: ApiKey = None, bearer: Bearer = None) -> Response:
        _key(services, key, bearer)
        raise NotSupported(f"{what} is not built in Cubicle yet")

    return refuse


for _path, _methods, _what in (
    ("/templates", ["GET", "POST"], "templates (E2B's template builds)"),
    ("/v2/templates", ["POST"], "templates (E2B's template builds)"),
    ("/v3/templates", ["POST"], "templates (E2B's template builds)"),
):
    router.add_api_route(_path, _missing(_what), methods=_methods, include_in_schema=False)
