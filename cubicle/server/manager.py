"""The sandbox manager: every desktop's lifecycle, above whichever runtime starts them.

It creates desktops and waits until they are drawn, hands out guest clients to the API,
runs every batch of actions (`run_actions`: the one door for the API, the viewers and the
agent), stops desktops that sat idle past their timeout, and notices when one dies, so that
calls to it answer 410 with the reason instead of hanging. What happens is told to
listeners through `events` (`cubicle.server.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cubicle.protocol import actions as a
from cubicle.protocol.errors import (
    CapacityReached,
    Conflict,
    CubicleError,
    DesktopGone,
    DesktopNotFound,
    DesktopPaused,
    DesktopStarting,
    DiskFull,
    InvalidRequest,
    NotFound,
    NotSupported,
    SandboxStartError,
)
from cubicle.protocol.lanes import Lane, LaneName, desktop_lanes
from cubicle.protocol.models import Screen
from cubicle.protocol.routes import GuestPath
from cubicle.protocol.service import (
    ActionSource,
    CreateDesktop,
    DesktopEgress,
    DesktopInfo,
    DesktopMetrics,
    DesktopNetwork,
    DesktopStatus,
    Forked,
    ForkError,
    Lifecycle,
    NodeInfo,
    PoolInfo,
    SnapshotInfo,
    UsageSample,
    is_cidr,
)
from cubicle.server import parked, reopen
from cubicle.server.events import ActionsRan, DesktopEnded, DesktopParked, Events
from cubicle.server.guest_client import JSON, GuestClient
from cubicle.server.heap import HeapTrim
from cubicle.server.metrics import Metrics
from cubicle.server.networks import Networks
from cubicle.server.outbound import Outbound
from cubicle.server.parked import Parked
from cubicle.server.pool import DesktopKind, PoolHooks, WarmPool
from cubicle.server.runtime import Found, Runtime, Sandbox, SandboxSpec, make_runtime
from cubicle.server.runtime.base import SandboxEgress
from cubicle.server.settings import Settings
from cubicle.server.volumes import Volumes

log = logging.getLogger("cubicle.manager")

KEEP_ENDED = 100
"""How many failed or stopped desktops stay listed (with their reason) until deleted."""
_WARM_UP_SHOT = {"format": "jpeg", "max_width": "64"}
"""The screenshot a spare takes once drawn, to load the capture and encoding code."""
BACKGROUND_START_TIMEOUT_S = 600.0
"""How long a spare may take to boot in the background: a busy host gives it little CPU.
Once someone takes it, `start_timeout_s` counts again from then."""


@dataclass
class _Desktop:
    spec: SandboxSpec
    runtime: str
    timeout_s: int
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    status: DesktopStatus = "starting"
    reason: str | None = None
    startup_ms: float | None = None
    from_pool: bool = False
    last_used: float = field(default_factory=time.monotonic)
    holders: set[object] = field(default_factory=set)
    """Whoever keeps the desktop alive past its idle timeout (a recording, a controller)."""
    sandbox: Sandbox | None = None
    client: GuestClient | None = None
    watcher: asyncio.Task | None = None
    degraded: str | None = None
    """The guest's last `degraded` report: what broke inside and what it did about it."""
    lanes: dict[LaneName, Lane] = field(default_factory=desktop_lanes)
    """Bounded lines for the desktop's slow calls (`cubicle.protocol.lanes`)."""
    networks: list[str] = field(default_factory=list)
    """The private networks it joined."""
    egress: DesktopEgress | None = None
    """Its own egress rules."""
    secrets: list[str] = field(default_factory=list)
    """The secrets it uses through the egress proxy."""
    paused_at: datetime | None = None
    parked_disk: Path | None = None
    """What a parked desktop's runtime kept of it (`Sandbox.park`), to start it again from:
    a desktop paused without memory, or one with memory its stopping service parked."""
    parked_memory: bool = False
    """Its memory is parked as well (runtimes with `Runtime.parks_memory`)."""
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    pausing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while it pauses or resumes: one at a time."""

    def info(self, domain: str, usage: UsageSample | None = None) -> DesktopInfo:
        expires = None
        if self.status == "ready" and not self.holders:
            idle = time.monotonic() - self.last_used
            expires = datetime.now(UTC) + timedelta(seconds=max(0.0, self.timeout_s - idle))
        return DesktopInfo(
            id=self.spec.id,
            status=self.status,
            screen=Screen(width=self.spec.width, height=self.spec.height),
            network=self.spec.network,
            created_at=self.created_at,
            timeout_s=self.timeout_s,
            expires_at=expires,
            paused_at=self.paused_at,
            paused_memory=None
            if self.paused_at is None
            else self.parked_disk is None or self.parked_memory,
            lifecycle=self.lifecycle,
            usage=usage,
            reason=self.reason,
            degraded=self.degraded,
            startup_ms=self.startup_ms,
            from_pool=self.from_pool,
            runtime=self.runtime,
            node=self._node(),
            networks=self.networks,
            egress=self.egress,
            domain=domain,
        )

    def _node(self) -> NodeInfo | None:
        place = self.sandbox.node if self.sandbox is not None else None
        return NodeInfo(id=place.id, address=place.address) if place is not None else None


def _outlives_a_restart(record: _Desktop) -> bool:
    """A paused desktop a later service can take over from its kept disk: one that uses
    nothing only this service holds (secrets, private networks, egress rules, host names,
    volumes mounted for it)."""
    spec = record.spec
    return not (record.secrets or record.networks or record.egress or spec.hosts or spec.volumes)


def _outlives_service(record: _Desktop) -> bool:
    """A handed-out desktop in a runtime whose sandboxes outlive the service."""
    return record.status == "ready" and record.sandbox is not None and record.sandbox.detached


class SandboxManager:
    """Creates, tracks and stops the desktops of one service."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.events = Events()
        """`ActionsRan` and `DesktopEnded`, for the other rooms."""
        self._runtimes: dict[str, Runtime] = {}
        self._desktops: OrderedDict[str, _Desktop] = OrderedDict()
        self.pool: WarmPool[_Desktop] = WarmPool(
            settings,
            PoolHooks(
                new=self._spare,
                boot=self._boot_spare,
                foreground=self._foreground,
                discard=lambda d: self._end(d, "stopped", "a spare the warm pool no longer needs"),
                in_use=self._running,
            ),
        )
        """Desktops booted before anyone asked, handed out by `create` (not listed)."""
        self.networks = Networks(settings.data_dir, self.events)
        """Private networks desktops join at create (`cubicle.server.networks`)."""
        self.outbound = Outbound(settings)
        """Secrets, and the egress proxy that uses them (`cubicle.server.outbound`)."""
        self.volumes = Volumes(settings.data_dir / "volumes")
        """Named file systems desktops mount, outliving them (`cubicle.server.volumes`)."""
        self.metrics = Metrics(settings.metrics_interval_s)
        """What each desktop uses, read every few seconds (`cubicle.server.metrics`)."""
        self._reaper: asyncio.Task | None = None
        self._heap = HeapTrim()
        """Gives the heap a desktop's life left free back to the system once it ended."""

    # --- lifecycle of the manager -----------------------------------------------------------

    async def start(self) -> None:
        """Build the default runtime (so a broken host fails at start), take over the
        desktops an earlier service left running in it, and begin the reaper."""
        runtime = self.runtime(self.settings.runtime)
        if self._reaper is None:
            await self.networks.start()
            for found in await runtime.recover():
                await self._adopt(runtime.name, found)
            self._take_over_parked()
            self._reaper = asyncio.create_task(self._reap_idle(), name="reap-idle-desktops")
            self.metrics.start(self._measured)
            self.pool.start()

    async def stop(self) -> None:
        """Stop every desktop this manager started, pooled ones too; idempotent."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        self._reaper = None
        await self.metrics.close()
        await self.pool.stop()
        detached = [d for d in self._desktops.values() if _outlives_service(d)]
        kept = [d for d in self._desktops.values() if await self._keep_for_later(d)]
        ending = [d for d in self._desktops.values() if d not in detached and d not in kept]
        await asyncio.gather(
            *(self._let_go(d) for d in detached),
            *(self._end(d, "stopped", "the service shut down") for d in ending),
            return_exceptions=True,
        )
        runtimes, self._runtimes = list(self._runtimes.values()), {}
        await asyncio.gather(*(runtime.close() for runtime in runtimes))
        await asyncio.to_thread(self.volumes.close)
        await self.networks.close()
        await asyncio.to_thread(self.outbound.close)
        await self._heap.close()

    async def _keep_for_later(self, record: _Desktop) -> bool:
        """Whether a stopping service leaves this desktop for the next one: a paused one.
        One paused with its memory is parked with it where the runtime can (microVM: its
        RAM saved to disk), else with its disk only."""
        if record.status != "paused" or not _outlives_a_restart(record):
            return False
        if record.parked_disk is not None:
            return True
        keep_memory = self.runtime(record.runtime).parks_memory
        try:
            async with record.pausing:
                await self._park(record, keep_memory=keep_memory)
        except CubicleError as exc:  # a runtime that cannot keep a disk: it ends
            log.info("paused desktop %s cannot be kept for later: %s", record.spec.id, exc)
            return False
        kept = "its memory and disk" if keep_memory else "its disk only"
        log.info("paused desktop %s kept for the next service (%s)", record.spec.id, kept)
        return True

    def _take_over_parked(self) -> None:
        """List the desktops an earlier service paused without memory, as they were."""
        for found in parked.load_all(self.settings.data_dir / "parked"):
            if found.spec.id in self._desktops:
                continue
            record = _Desktop(found.spec, found.runtime, found.timeout_s, found.created_at)
            record.status, record.paused_at = "paused", found.paused_at
            record.parked_disk, record.lifecycle = found.disk, found.lifecycle
            record.parked_memory = found.memory
            self._desktops[found.spec.id] = record
            log.info("desktop %s: paused by an earlier service, resumable", found.spec.id)

    def runtime(self, name: str) -> Runtime:
        """The runtime called `name`, built on first use."""
        if name not in self._runtimes:
            self._runtimes[name] = make_runtime(name, self.settings)
        return self._runtimes[name]

    async def _adopt(self, runtime: str, found: Found) -> None:
        """Manage a desktop an earlier service started, listed as it was; a spare of its
        warm pool is stopped (this service's pool boots its own)."""
        record = _Desktop(found.spec, runtime, found.timeout_s, created_at=found.created_at)
        record.sandbox = found.sandbox
        if found.timeout_s == 0:
            await self._end(record, "stopped", "a warm pool spare of an earlier service")
            return
        record.client = GuestClient(found.sandbox.endpoint)
        record.status = "ready"
        record.watcher = asyncio.create_task(self._watch(record), name=f"watch-{found.spec.id}")
        self._desktops[found.spec.id] = record
        log.info("desktop %s found again (%s)", found.spec.id, runtime)

    async def _let_go(self, record: _Desktop) -> None:
        """Stop watching a desktop that outlives the service, and leave it running."""
        watcher, record.watcher = record.watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if record.client is not None:
            await record.client.close()

    # --- desktops ------------------------------------------------------------------------

    def _spec(self, request: CreateDesktop) -> SandboxSpec:
        width, height = request.resolution
        return SandboxSpec(
            id=uuid.uuid4().hex[:12],
            width=width,
            height=height,
            network=request.network,
            memory_mb=request.memory_mb or self.settings.memory_mb,
            max_pids=request.max_pids or self.settings.max_pids,
            cpu_cores=self.settings.cpu_cores,
            disk_mb=request.disk_mb or self.settings.disk_mb,
            max_file_bytes=self.settings.max_upload_bytes,
            node_labels=request.node_labels(),
            snapshot=request.snapshot,
            hosts=tuple(request.hosts.items()),
        )

    def _running(self) -> int:
        """Desktops that hold a place: starting, ready, or paused (memory still held)."""
        return sum(d.status in ("starting", "ready", "paused") for d in self._desktops.values())

    def _check_maxima(self, request: CreateDesktop) -> None:
        """Refuse asks over the operator's per-desktop maxima (422, naming the setting)."""
        s = self.settings
        for asked, most, unit, name in (
            (request.memory_mb, s.desktop_max_memory_mb, "MiB of memory", "DESKTOP_MAX_MEMORY_MB"),
            (request.max_pids, s.desktop_max_pids, "processes", "DESKTOP_MAX_PIDS"),
            (request.disk_mb, s.desktop_max_disk_mb, "MiB of disk", "DESKTOP_MAX_DISK_MB"),
        ):
            if asked is not None and asked > most:
                raise InvalidRequest(
                    f"a desktop may have at most {most} {unit} here (asked {asked}; "
                    f"the operator sets CUBICLE_{name})"
                )

    async def create(self, request: CreateDesktop) -> DesktopInfo:
        """Start a desktop (or take a warm one) and return once it is drawn."""
        self._check_maxima(request)
        runtime = request.runtime or self.settings.runtime
        # an unknown runtime, or node labels it cannot honour, is a 422 before anything starts
        if not self.runtime(runtime).places_on_nodes and request.node:
            raise InvalidRequest(
                f"node labels choose a cluster node, and the {runtime} runtime has none: "
                "use the ray runtime or leave out `node`"
            )
        if request.networks or request.alias:
            self._check_networks(runtime, request)
        if request.egress is not None or request.secrets or request.hosts:
            self._check_egress(runtime, request)
        if request.volumes and not self.runtime(runtime).mounts_volumes:
            raise NotSupported(f"volumes: the {runtime} runtime cannot mount them: use local")
        if request.lifecycle.on_timeout == "pause" and not self.runtime(runtime).can_pause:
            raise NotSupported(
                f'"on_timeout": "pause": the {runtime} runtime cannot pause desktops here '
                "(local needs a cgroup freezer; microvm can)"
            )
        running = self._running()
        if running >= self.settings.max_desktops:
            raise CapacityReached(
                f"{running} desktops are running or paused, the limit is "
                f"{self.settings.max_desktops}: kill one (DELETE /api/desktops/{{id}}) or raise "
                "CUBICLE_MAX_DESKTOPS"
            )
        record = await self._take_warm(request)
        if record is None:
            await self.pool.make_room()
            record = _Desktop(self._spec(request), runtime, request.timeout_s)
            record.secrets = list(request.secrets)
            self._desktops[record.spec.id] = record
            try:
                if request.secrets:
                    record.spec = self._with_secrets(record.spec, request)
                if request.volumes:
                    record.spec = await self._with_volumes(record.spec, request)
                await self._boot(record)
            except BaseException:
                del self._desktops[record.spec.id]
                self.outbound.proxy.unregister(record.spec.id)
                await asyncio.to_thread(self.volumes.detach, record.spec.id)
                raise
        record.lifecycle = request.lifecycle
        self.pool.refill()
        if request.networks:
            await self._join_networks(record, request)
        if request.egress is not None or request.secrets:
            try:
                self.set_egress(record.spec.id, request.egress or DesktopEgress())
            except BaseException as exc:
                await self._end(record, "failed", f"could not set its egress rules: {exc}")
                raise
        return self._info(record)

    async def _with_volumes(self, spec: SandboxSpec, request: CreateDesktop) -> SandboxSpec:
        """The spec of a desktop with volumes: each mounted on this host, bound in."""
        mounts = request.volume_mounts()
        paths = await asyncio.to_thread(self.volumes.attach, spec.id, mounts)
        binds = tuple(
            (str(path), inside, mount.read_only)
            for path, (inside, mount) in zip(paths, mounts, strict=True)
        )
        return dataclasses.replace(spec, volumes=binds)

    def _with_secrets(self, spec: SandboxSpec, request: CreateDesktop) -> SandboxSpec:
        """The spec of a desktop that uses secrets: their placeholders in its environment,
        and its egress proxy's CA in its trust bundle."""
        found = [self.outbound.secrets.get(name) for name in request.secrets]
        tenant = self.outbound.proxy.register(
            spec.id, request.egress, request.secrets, request.hosts
        )
        return dataclasses.replace(
            spec,
            env=tuple((secret.env, secret.placeholder) for secret in found),
            trust_pem=tenant.trust_pem,
        )

    def set_egress(self, desktop_id: str, rules: DesktopEgress) -> DesktopInfo:
        """The desktop's own egress rules from its next connection on (rules by host name
        and secrets through the egress proxy)."""
        record = self._record(desktop_id)
        if record.sandbox is None or record.status != "ready":
            raise DesktopGone(f"desktop {desktop_id} is {record.status}")
        proxy = self.outbound.proxy
        tenant = proxy.tenant(desktop_id)
        if tenant is not None:
            proxy.update(desktop_id, rules)
        elif rules.names():
            tenant = proxy.register(desktop_id, rules, [], dict(record.spec.hosts))
        record.sandbox.set_egress(
            SandboxEgress(
                allow=tuple(rule for rule in rules.allow if is_cidr(rule)),
                deny=tuple(rule for rule in rules.deny if is_cidr(rule)),
                restricted=bool(rules.allow),
                proxy=(proxy.port, tenant.token) if tenant is not None else None,
            )
        )
        record.egress = rules if rules.allow or rules.deny else None
        return self._info(record)

    def network(self, desktop_id: str) -> DesktopNetwork:
        """A desktop's egress rules, secrets, and what its egress proxy refused lately."""
        record = self._record(desktop_id)
        tenant = self.outbound.proxy.tenant(desktop_id)
        return DesktopNetwork(
            egress=record.egress,
            secrets=record.secrets,
            refused=list(tenant.refused) if tenant is not None else [],
        )

    def _check_egress(self, runtime: str, request: CreateDesktop) -> None:
        """Refuse egress rules, secrets or hosts a create cannot apply, before anything
        starts."""
        if not request.network:
            raise InvalidRequest(
                'egress rules, secrets and hosts rule a network: create it with "network": true'
            )
        if not self.runtime(runtime).desktop_egress:
            raise NotSupported(
                f"the {runtime} runtime has no per-desktop egress rules, secrets or hosts "
                "yet: use the local runtime"
            )
        for name in request.secrets:
            if self.outbound.secrets.find(name) is None:
                raise InvalidRequest(f"no secret {name!r}: make it with POST /api/secrets")

    def _check_networks(self, runtime: str, request: CreateDesktop) -> None:
        """Refuse networks a create cannot join, before anything starts."""
        if request.alias and not request.networks:
            raise InvalidRequest("an alias names a desktop on its networks: give `networks`")
        if not self.runtime(runtime).joins_networks:
            raise NotSupported(
                f"the {runtime} runtime cannot join private networks yet: use the local "
                "runtime for desktops that talk to each other"
            )
        self.networks.check_can_join(request.networks, request.alias)

    async def _join_networks(self, record: _Desktop, request: CreateDesktop) -> None:
        """Plug a ready desktop into its networks; a desktop that cannot join is ended."""
        place = record.sandbox.network_namespace() if record.sandbox is not None else None
        try:
            if place is None:
                raise NotSupported(f"desktop {record.spec.id} has no network namespace here")
            await self.networks.join(record.spec.id, request.networks, request.alias, *place)
        except BaseException as exc:
            await self._end(record, "failed", f"could not join its networks: {exc}")
            raise
        record.networks = list(request.networks)

    async def _boot(self, record: _Desktop) -> None:
        """Start the record's sandbox and wait until its desktop is drawn."""
        spec = record.spec
        started = time.perf_counter()
        timeout_s = BACKGROUND_START_TIMEOUT_S if spec.nice else self.settings.start_timeout_s
        try:
            record.sandbox = await self.runtime(record.runtime).start(spec)
            if spec.nice and not record.spec.nice:  # taken while it started
                await record.sandbox.foreground()
            timeout_s = record.sandbox.draw_timeout_s or timeout_s
            async with asyncio.timeout(timeout_s):
                await self._until_ready(record.sandbox)
        except BaseException as exc:
            reason = str(exc) if isinstance(exc, SandboxStartError) else None
            if isinstance(exc, TimeoutError):
                reason = f"the desktop was not drawn within {timeout_s:.0f} s"
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                if record.sandbox is not None:
                    await record.sandbox.stop()
                raise DiskFull(
                    f"desktop {spec.id} did not start: the disk of {self.settings.data_dir} "
                    "is full; free some space and try again"
                ) from exc
            if record.sandbox is not None:
                await record.sandbox.stop()
            if reason is not None:
                raise SandboxStartError(f"desktop {spec.id} did not start: {reason}") from exc
            raise
        record.startup_ms = (time.perf_counter() - started) * 1000
        record.client = GuestClient(record.sandbox.endpoint)
        if spec.disk_image is not None or (
            spec.snapshot is not None and not self.runtime(record.runtime).snapshots_memory
        ):  # booted on another desktop's disk: what it had open opens again
            await reopen.reopen(record.client, spec.id)
        record.status = "ready"
        record.last_used = time.monotonic()
        record.sandbox.kept(record.timeout_s, record.created_at)
        record.watcher = asyncio.create_task(self._watch(record), name=f"watch-{spec.id}")
        log.info("desktop %s ready in %.0f ms", spec.id, record.startup_ms)

    # --- the warm pool ---------------------------------------------------------------------

    def want_warm(self, owner: str, count: int, request: CreateDesktop | None = None) -> None:
        """Keep `count` drawn spares like `request` (default: the default kind) for `owner`,
        besides `CUBICLE_WARM_POOL` for API users; 0 withdraws `owner`'s wish."""
        self.pool.want(owner, count, request)

    def pool_info(self) -> PoolInfo:
        return self.pool.info()

    def _spare(self, kind: DesktopKind) -> _Desktop:
        spec = dataclasses.replace(self._spec(kind.request()), nice=self.settings.warm_pool_nice)
        return _Desktop(spec, kind.runtime, timeout_s=0)

    async def _boot_spare(self, record: _Desktop) -> None:
        """Boot a spare, then have its guest load what it loads on first use (the screen
        capture and the video's encoder): the first screenshot of a desktop taken from the
        pool is then as quick as any other. Only spares pay that memory up front."""
        await self._boot(record)
        assert record.client is not None
        try:
            await record.client.request("GET", GuestPath.SCREENSHOT, params=_WARM_UP_SHOT)
            await record.client.request("GET", GuestPath.FRAMES_STATS)
        except CubicleError as exc:  # a spare that cannot warm up is still a desktop
            log.warning("spare %s did not warm up: %s", record.spec.id, exc.message)

    @staticmethod
    async def _foreground(record: _Desktop) -> None:
        if record.spec.nice:
            record.spec = dataclasses.replace(record.spec, nice=0)
            if record.sandbox is not None:
                await record.sandbox.foreground()

    async def _take_warm(self, request: CreateDesktop) -> _Desktop | None:
        """A spare for this request (waiting for one being booted), or None."""
        if request.node or request.secrets or request.hosts or request.volumes:  # made alike
            return None
        record = await self.pool.take(request)
        if record is None:
            return None
        record.from_pool = True
        record.timeout_s = request.timeout_s
        record.created_at = datetime.now(UTC)
        record.last_used = time.monotonic()
        if record.sandbox is not None:
            record.sandbox.kept(record.timeout_s, record.created_at)
        self._desktops[record.spec.id] = record
        return record

    @staticmethod
    async def _until_ready(sandbox: Sandbox) -> None:
        async for event in sandbox.events():
            log.debug("desktop %s: %s", sandbox.id, event.event)
            if event.event == "ready":
                return
            if event.event == "failed":
                raise SandboxStartError(event.reason or "the guest reported a failure")
        raise SandboxStartError(await sandbox.wait())

    async def _watch(self, record: _Desktop) -> None:
        """Drain the guest's events and mark the desktop failed when its sandbox ends."""
        assert record.sandbox is not None
        async for event in record.sandbox.events():
            if event.event == "degraded":
                log.warning("desktop %s degraded: %s", record.spec.id, event.reason)
                record.degraded = event.reason
        reason = await record.sandbox.wait()
        if record.status in ("ready", "paused"):
            log.warning("desktop %s failed: %s", record.spec.id, reason)
            await self._end(record, "failed", reason)

    async def _end(self, record: _Desktop, status: DesktopStatus, reason: str) -> None:
        if record.status in ("failed", "stopped"):
            return
        record.status, record.reason = status, reason
        if record.spec.id not in self._desktops:
            self.pool.forget(record)
        watcher, record.watcher = record.watcher, None
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if record.client is not None:
            await record.client.close(f"desktop {record.spec.id} is {status}: {reason}")
        if record.sandbox is not None:
            await record.sandbox.stop()
        if record.parked_disk is not None:
            await asyncio.to_thread(parked.forget, record.parked_disk)
            record.parked_disk = None
        if record.spec.volumes:
            await asyncio.to_thread(self.volumes.detach, record.spec.id)
        self.outbound.proxy.unregister(record.spec.id)
        self.metrics.forget(record.spec.id)
        self.events.emit(DesktopEnded(record.spec.id, status, reason))
        self._heap.soon()
        ended = [k for k, d in self._desktops.items() if d.status in ("failed", "stopped")]
        for key in ended[:-KEEP_ENDED]:
            del self._desktops[key]

    def _record(self, desktop_id: str) -> _Desktop:
        try:
            return self._desktops[desktop_id]
        except KeyError:
            raise DesktopNotFound(
                f"no desktop {desktop_id!r}: list them with GET /api/desktops"
            ) from None

    def _info(self, record: _Desktop) -> DesktopInfo:
        return record.info(self.settings.port_domain, self.metrics.latest(record.spec.id))

    def _measured(self) -> list[tuple[str, Sandbox]]:
        """The desktops whose usage is read: running or paused."""
        return [
            (desktop_id, record.sandbox)
            for desktop_id, record in self._desktops.items()
            if record.status in ("ready", "paused") and record.sandbox is not None
        ]

    def metrics_of(
        self, desktop_id: str, start: datetime | None = None, end: datetime | None = None
    ) -> DesktopMetrics:
        """A desktop's usage readings from `start` to `end`, and its limits."""
        record = self._record(desktop_id)
        spec = record.spec
        return DesktopMetrics(
            desktop_id=desktop_id,
            interval_s=self.metrics.interval_s,
            memory_limit_bytes=spec.memory_mb * 1024 * 1024,
            disk_limit_bytes=spec.disk_mb * 1024 * 1024,
            cpu_cores=spec.cpu_cores,
            samples=self.metrics.series(desktop_id, start, end),
        )

    def list(self) -> list[DesktopInfo]:
        return [self._info(record) for record in self._desktops.values()]

    def get(self, desktop_id: str) -> DesktopInfo:
        return self._info(self._record(desktop_id))

    def guest(self, desktop_id: str, *, touch: bool = True) -> GuestClient:
        """The guest client of a ready desktop; counts as activity for the idle timeout
        unless `touch` is False (watching a desktop does not keep it alive)."""
        record = self._record(desktop_id)
        if record.status == "starting":
            raise DesktopStarting(f"desktop {desktop_id} is still starting: retry in a moment")
        if record.status == "paused":
            raise DesktopPaused(
                f"desktop {desktop_id} is paused: resume it first "
                f"(POST /api/desktops/{desktop_id}/resume, or the SDK's resume())"
            )
        if record.status != "ready" or record.client is None:
            raise DesktopGone(f"desktop {desktop_id} is {record.status}: {record.reason}")
        if touch:
            record.last_used = time.monotonic()
        return record.client

    async def awake(self, desktop_id: str, *, touch: bool = True) -> GuestClient:
        """`guest()`, once a paused desktop whose lifecycle says `auto_resume` is resumed:
        the door of calls that use a desktop (API calls, its ports, a new viewer)."""
        record = self._record(desktop_id)
        if record.status == "paused" and record.lifecycle.auto_resume:
            log.info("desktop %s: used while paused, resuming it (auto_resume)", desktop_id)
            await self.resume(desktop_id)
        return self.guest(desktop_id, touch=touch)

    def lane(self, desktop_id: str, kind: LaneName) -> Lane:
        """The desktop's lane for a slow kind of call."""
        return self._record(desktop_id).lanes[kind]

    async def run_actions(
        self, desktop_id: str, actions: Sequence[a.Action], *, source: ActionSource
    ) -> a.ActionsResponse:
        """Run a batch on a desktop, in order, for anyone (API, viewer, agent).

        The guest checks the whole batch against its live screen before anything runs; once
        it ran, listeners hear `ActionsRan` (recordings log it from there).
        """
        guest = await self.awake(desktop_id)
        started = time.monotonic()
        body = a.action_batch_adapter.dump_json(list(actions))
        answer = await guest.request("POST", GuestPath.ACTIONS, content=body, content_type=JSON)
        result = answer.model(a.ActionsResponse)
        self.events.emit(ActionsRan(desktop_id, tuple(actions), started, source, result))
        return result

    async def snapshot(self, desktop_id: str, name: str) -> SnapshotInfo:
        """Save a ready or paused desktop as a named snapshot, if its runtime can: the disk
        (local), or disk and memory (microvm)."""
        record = self._record(desktop_id)
        async with record.pausing:  # a local snapshot freezes it for the copy
            if record.status != "paused":
                self.guest(desktop_id)  # ready, or the reason it is not
            if record.sandbox is None:
                how = "parked on disk" if record.parked_memory else "paused without its memory"
                raise Conflict(f"desktop {desktop_id} is {how}: resume it first")
            runtime = self.runtime(record.runtime)
            if runtime.snapshots_memory or record.status != "ready":
                return await runtime.snapshot(record.sandbox, name)
            await self._note_open_apps(record)  # its copies open them again
            try:
                return await runtime.snapshot(record.sandbox, name)
            finally:
                if record.client is not None:
                    with contextlib.suppress(CubicleError):
                        await reopen.forget(record.client)

    def _in_use(self) -> list[Runtime]:
        """The default runtime and every other one this service built, by name."""
        return [self.runtime(name) for name in sorted({self.settings.runtime, *self._runtimes})]

    def snapshots(self) -> list[SnapshotInfo]:
        """The named snapshots of every runtime this service started desktops in."""
        return [saved for runtime in self._in_use() for saved in runtime.snapshots()]

    async def delete_snapshot(self, name: str) -> None:
        """Delete snapshot `name` wherever it is; `NotFound` if nowhere."""
        deleted = [await runtime.delete_snapshot(name) for runtime in self._in_use()]
        if not any(deleted):
            raise NotFound(f"no snapshot {name!r}: list them with GET /api/snapshots")

    async def fork(self, desktop_id: str, count: int) -> Forked:
        """`count` new desktops, each starting from this one as it is now: its disk (local),
        or its disk and memory (microvm); the parent goes on. Each child has its own id,
        user and disk copy, none of its secrets or networks; one that fails is reported by
        its index, the others are still made."""
        record = self._record(desktop_id)
        name = f"fork-{desktop_id}-{uuid.uuid4().hex[:6]}"
        await self.snapshot(desktop_id, name)
        spec = record.spec
        request = CreateDesktop(
            resolution=(spec.width, spec.height),
            network=spec.network,
            memory_mb=spec.memory_mb,
            max_pids=spec.max_pids,
            runtime=record.runtime,
            snapshot=name,
            timeout_s=record.timeout_s,
            lifecycle=record.lifecycle,
        )
        try:
            made = await asyncio.gather(
                *(self.create(request) for _ in range(count)), return_exceptions=True
            )
        finally:
            kept = True  # microvm: the children's disks and memory build on it
            with contextlib.suppress(Conflict):
                kept = not await self.runtime(record.runtime).delete_snapshot(name)
        forked = Forked(desktops=[], snapshot=name if kept else None)
        for index, result in enumerate(made):
            if isinstance(result, DesktopInfo):
                forked.desktops.append(result)
            elif isinstance(result, CubicleError):
                forked.errors.append(ForkError(index=index, error=result.code, detail=str(result)))
            elif isinstance(result, BaseException):
                log.exception("fork %d of %s failed", index, desktop_id, exc_info=result)
                detail = f"{type(result).__name__}: see the service's log"
                forked.errors.append(ForkError(index=index, error="internal_error", detail=detail))
        return forked

    async def pause(self, desktop_id: str, *, keep_memory: bool = True) -> DesktopInfo:
        """Pause a ready desktop until `resume`; calls to it answer `DesktopPaused` and its
        idle timeout stops counting. With its memory: everything in it is frozen where it
        stands and uses no CPU. Without (`keep_memory=False`): its programs end and only
        its disk is kept, so it holds no memory either; resuming boots it again on that
        disk. Pausing a paused desktop is a `Conflict`."""
        record = self._record(desktop_id)
        async with record.pausing:  # one pause or resume at a time
            if record.status == "paused":
                raise Conflict(f"desktop {desktop_id} is already paused")
            self.guest(desktop_id, touch=False)  # ready, or the reason it is not
            assert record.sandbox is not None
            if keep_memory:
                await record.sandbox.pause()
            else:
                await self._park(record)
            record.status, record.paused_at = "paused", datetime.now(UTC)
        log.info(
            "desktop %s paused (%s)", desktop_id, "memory kept" if keep_memory else "disk only"
        )
        return self._info(record)

    async def _note_open_apps(self, record: _Desktop) -> None:
        """Write down in its disk the apps it has open, for a desktop that boots on that
        disk to open again (`cubicle.server.reopen`); a failure only leaves them closed."""
        if record.client is None:
            return
        try:
            await reopen.note(record.client)
        except CubicleError as exc:
            log.warning("desktop %s: its open apps were not noted: %s", record.spec.id, exc)

    async def _park(self, record: _Desktop, *, keep_memory: bool = False) -> None:
        """Stop a desktop's sandbox but keep its disk (and with `keep_memory` its memory),
        to start it again from on `resume`; without memory, the apps it had open are noted
        to open again then."""
        sandbox = record.sandbox
        assert sandbox is not None
        if not keep_memory:
            if record.status == "paused":  # frozen: thawed a moment to answer
                with contextlib.suppress(CubicleError):
                    await sandbox.resume()
            await self._note_open_apps(record)
        watcher, record.watcher = record.watcher, None
        if watcher is not None:  # its sandbox ends on purpose: no failure to report
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        try:
            record.parked_disk = await sandbox.park(keep_memory=keep_memory)
        except BaseException:
            if watcher is not None:  # refused, or failed on the way: watched again
                record.watcher = asyncio.create_task(
                    self._watch(record), name=f"watch-{record.spec.id}"
                )
            raise
        record.parked_memory = keep_memory
        self.events.emit(DesktopParked(record.spec.id))
        record.paused_at = record.paused_at or datetime.now(UTC)
        if record.client is not None:
            await record.client.close(f"desktop {record.spec.id} is paused")
        record.sandbox = record.client = None
        if _outlives_a_restart(record):
            await asyncio.to_thread(
                Parked(
                    record.spec,
                    record.runtime,
                    record.timeout_s,
                    record.created_at,
                    record.paused_at,
                    record.lifecycle,
                    record.parked_disk,
                    keep_memory,
                ).save
            )

    async def resume(self, desktop_id: str) -> DesktopInfo:
        """Let a paused desktop run on from where it stopped (one paused without memory
        boots again on its disk); its idle timeout counts again from now. Resuming a
        desktop that runs changes nothing."""
        record = self._record(desktop_id)
        async with record.pausing:
            if record.status != "paused":
                self.guest(desktop_id)  # ready, or the reason it is not
                return self._info(record)
            if record.parked_disk is not None:
                record.spec = dataclasses.replace(record.spec, disk_image=record.parked_disk)
                try:
                    await self._boot(record)
                except BaseException as exc:
                    await self._end(record, "failed", f"it did not boot again: {exc}")
                    raise
                parked.record_path(record.parked_disk).unlink(missing_ok=True)
                record.parked_disk, record.parked_memory = None, False
                record.spec = dataclasses.replace(record.spec, disk_image=None)
            else:
                assert record.sandbox is not None
                await record.sandbox.resume()
            record.status, record.paused_at = "ready", None
            record.last_used = time.monotonic()
        log.info("desktop %s resumed", desktop_id)
        return self._info(record)

    def hold(self, desktop_id: str, holder: object) -> None:
        """Keep a ready desktop alive past its idle timeout until `release(…, holder)`."""
        self.guest(desktop_id)
        self._record(desktop_id).holders.add(holder)

    def release(self, desktop_id: str, holder: object) -> None:
        """Let the idle timeout run again (counted from now) once no one holds it."""
        record = self._desktops.get(desktop_id)
        if record is not None and holder in record.holders:
            record.holders.discard(holder)
            record.last_used = time.monotonic()

    def extend(self, desktop_id: str, timeout_s: int) -> DesktopInfo:
        """Set a new idle timeout, counted from now."""
        self.guest(desktop_id)
        record = self._record(desktop_id)
        record.timeout_s = timeout_s
        if record.sandbox is not None:
            record.sandbox.kept(timeout_s, record.created_at)
        return self._info(record)

    async def kill(self, desktop_id: str) -> None:
        """Stop a desktop and forget it."""
        record = self._record(desktop_id)
        await self._end(record, "stopped", "killed through the API")
        self._desktops.pop(desktop_id, None)

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            for record in list(self._desktops.values()):
                await self._reap(record)

    async def _reap(self, record: _Desktop) -> None:
        """End (or pause) a desktop its lifecycle says is done with."""
        lifecycle, desktop_id = record.lifecycle, record.spec.id
        if record.status not in ("ready", "paused"):
            return
        lived = (datetime.now(UTC) - record.created_at).total_seconds()
        if lifecycle.max_lifetime_s is not None and lived > lifecycle.max_lifetime_s:
            log.info("desktop %s lived %.0f s: stopping", desktop_id, lived)
            reason = f"lived more than its max_lifetime_s ({lifecycle.max_lifetime_s} s)"
            await self._end(record, "stopped", reason)
            return
        if record.status == "paused":
            retention = self.settings.paused_retention_s
            assert record.paused_at is not None
            if (datetime.now(UTC) - record.paused_at).total_seconds() > retention:
                reason = f"paused for more than {retention} s (CUBICLE_PAUSED_RETENTION_S)"
                await self._end(record, "stopped", reason)
            return
        idle = time.monotonic() - record.last_used
        if record.holders or idle <= record.timeout_s:
            return
        if lifecycle.on_timeout == "pause":
            log.info("desktop %s idle for %.0f s: pausing", desktop_id, idle)
            try:
                await self.pause(desktop_id, keep_memory=lifecycle.keep_memory)
                return
            except CubicleError as exc:  # ended meanwhile, or the freeze failed
                if record.status != "ready":
                    return
                reason = f"idle for more than {record.timeout_s} s, and it could not pause: {exc}"
                await self._end(record, "stopped", reason)
                return
        log.info("desktop %s idle for %.0f s: stopping", desktop_id, idle)
        await self._end(record, "stopped", f"idle for more than {record.timeout_s} s")
