"""The warm pool: drawn desktops kept ready, as many of each kind as someone asked for.

A spare is a desktop booted before anyone asked for it, not listed, handed out by `take`
to a create of its kind. How many spares of a kind the pool keeps is what its users want
(`want`: the task board asks for its concurrency) plus `CUBICLE_WARM_POOL` of the default
kind for API users; `CUBICLE_WARM_POOL=0` turns the pool off. Spares boot one at a time in
the background at `CUBICLE_WARM_POOL_NICE` (`SandboxSpec.nice`, 19: a boot takes only CPU
no desktop wants, so it never slows a running one), and only while the service is under
`CUBICLE_MAX_DESKTOPS` and the host has more than `CUBICLE_WARM_POOL_RESERVE_MB` of memory
available. A create that finds no drawn spare but one still booting takes that one and
raises it to normal priority: it is further along than a fresh boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from cubicle.protocol.errors import CapacityReached, CubicleError, SandboxStartError
from cubicle.protocol.service import CreateDesktop, PoolInfo, PoolKind
from cubicle.server.settings import Settings

log = logging.getLogger("cubicle.pool")

R = TypeVar("R")
"""What the manager keeps for one desktop."""

_RECHECK_S = 5.0
"""How often a pool held back by memory or capacity looks again, seconds."""
_BACKOFF_S = (1.0, 60.0)
"""First and longest pause after a spare failed to boot, seconds (doubling in between)."""


@dataclass(frozen=True)
class DesktopKind:
    """What makes two unused desktops interchangeable."""

    runtime: str
    width: int
    height: int
    network: bool
    memory_mb: int
    max_pids: int
    disk_mb: int
    snapshot: str | None = None
    """A microVM snapshot's name: its desktops are like each other, not like fresh ones."""

    @classmethod
    def of(cls, request: CreateDesktop, settings: Settings) -> DesktopKind:
        """The kind of desktop `request` asks for, the service's defaults filled in."""
        width, height = request.resolution
        return cls(
            runtime=request.runtime or settings.runtime,
            width=width,
            height=height,
            network=request.network,
            memory_mb=request.memory_mb or settings.memory_mb,
            max_pids=request.max_pids or settings.max_pids,
            disk_mb=request.disk_mb or settings.disk_mb,
            snapshot=request.snapshot,
        )

    def request(self) -> CreateDesktop:
        """A create request for a desktop of this kind."""
        return CreateDesktop(
            resolution=(self.width, self.height),
            network=self.network,
            memory_mb=self.memory_mb,
            max_pids=self.max_pids,
            disk_mb=self.disk_mb,
            runtime=self.runtime,
            snapshot=self.snapshot,
        )


@dataclass
class _Spare(Generic[R]):
    kind: DesktopKind
    desktop: R
    boot: asyncio.Task[None]
    """Done once the desktop is drawn (or failed to be)."""

    @property
    def ready(self) -> bool:
        return self.boot.done() and not self.boot.cancelled() and self.boot.exception() is None


@dataclass(frozen=True)
class PoolHooks(Generic[R]):
    """What the pool needs of the manager that owns it."""

    new: Callable[[DesktopKind], R]
    """A record for a desktop of this kind, not started."""
    boot: Callable[[R], Awaitable[None]]
    """Start it at the pool's niceness and return once drawn; raises if it is not."""
    foreground: Callable[[R], Awaitable[None]]
    """Raise a booting or booted spare to normal priority."""
    discard: Callable[[R], Awaitable[None]]
    """Stop a drawn spare nobody took."""
    in_use: Callable[[], int]
    """Desktops the service runs besides the spares (starting or ready)."""


def available_memory_mb() -> float | None:
    """The host's MemAvailable in MiB; None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class WarmPool(Generic[R]):
    """The spares of one service, and the task that boots them."""

    def __init__(self, settings: Settings, hooks: PoolHooks[R]) -> None:
        self.settings = settings
        self._hooks = hooks
        self._default = DesktopKind.of(CreateDesktop(), settings)
        self._wanted: dict[str, tuple[DesktopKind, int]] = {}
        self._spares: list[_Spare[R]] = []
        self._wake = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._raising: set[asyncio.Task[None]] = set()
        """Taken spares being raised to normal priority."""
        self._held_back: str | None = None

    # --- what is wanted -----------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.settings.warm_pool > 0

    def kind_of(self, request: CreateDesktop) -> DesktopKind:
        return DesktopKind.of(request, self.settings)

    def want(self, owner: str, count: int, request: CreateDesktop | None = None) -> None:
        """Keep `count` spares of `request`'s kind for `owner` (0 forgets the owner), on
        top of the margin for API users and what others want."""
        if count > 0:
            self._wanted[owner] = (self.kind_of(request or CreateDesktop()), count)
        else:
            self._wanted.pop(owner, None)
        self._wake.set()

    def targets(self) -> Counter[DesktopKind]:
        """How many spares of each kind the pool keeps."""
        targets: Counter[DesktopKind] = Counter()
        if not self.enabled:
            return targets
        targets[self._default] = self.settings.warm_pool
        for kind, count in self._wanted.values():
            targets[kind] += count
        return targets

    def info(self) -> PoolInfo:
        counts = Counter((s.kind, s.ready) for s in self._spares)
        targets = self.targets()
        kinds = [
            PoolKind(
                resolution=(kind.width, kind.height),
                network=kind.network,
                runtime=kind.runtime,
                target=targets[kind],
                ready=counts[(kind, True)],
                booting=counts[(kind, False)],
            )
            for kind in dict.fromkeys([*targets, *(s.kind for s in self._spares)])
        ]
        return PoolInfo(
            enabled=self.enabled,
            target=sum(targets.values()),
            ready=sum(k.ready for k in kinds),
            booting=sum(k.booting for k in kinds),
            wanted={owner: count for owner, (_, count) in self._wanted.items()},
            held_back=self._held_back,
            kinds=kinds,
        )

    def __len__(self) -> int:
        return len(self._spares)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._filler is None:
            self._filler = asyncio.create_task(self._fill(), name="fill-warm-pool")

    async def stop(self) -> None:
        """Stop booting and stop every spare; idempotent."""
        filler, self._filler = self._filler, None
        if filler is not None:
            filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await filler
        spares, self._spares = self._spares, []
        await asyncio.gather(*(self._drop(spare) for spare in spares), return_exceptions=True)
        await asyncio.gather(*self._raising, return_exceptions=True)

    def refill(self) -> None:
        """Look again at what is missing (a desktop ended, or one was taken)."""
        self._wake.set()

    def forget(self, desktop: R) -> None:
        """A spare that ended by itself (its sandbox died): no longer in the pool."""
        self._spares = [s for s in self._spares if s.desktop is not desktop]
        self._wake.set()

    # --- handing out --------------------------------------------------------------------

    async def take(self, request: CreateDesktop) -> R | None:
        """A spare of `request`'s kind, drawn (waiting for one still booting, raised to
        normal priority), or None when the pool has none."""
        kind = self.kind_of(request)
        mine = [s for s in self._spares if s.kind == kind and (s.ready or not s.boot.done())]
        if not mine:
            return None
        spare = next((s for s in mine if s.ready), mine[0])
        self._spares.remove(spare)
        self._wake.set()
        # A drawn spare is handed out at once, raised to normal priority meanwhile.
        raising = asyncio.create_task(self._hooks.foreground(spare.desktop))
        self._raising.add(raising)
        raising.add_done_callback(self._raising.discard)
        if not spare.boot.done():
            timeout_s = self.settings.start_timeout_s
            try:
                async with asyncio.timeout(timeout_s):  # counted from now, in the foreground
                    await asyncio.shield(spare.boot)
            except TimeoutError:
                await self._drop(spare)
                raise SandboxStartError(
                    f"a desktop was not drawn within {timeout_s:.0f} s of being asked for"
                ) from None
            except asyncio.CancelledError:
                if not spare.boot.done():  # the caller left: the spare goes on booting for another
                    self._spares.append(spare)
                raise
            except CapacityReached:
                raise  # no room for the spare: none for this create either
            except CubicleError:
                return None  # it failed to boot: the caller boots a desktop of its own
        return spare.desktop

    async def make_room(self) -> None:
        """Stop one spare if the service is at its limit, so that a create can start."""
        if self._spares and self._hooks.in_use() + len(self._spares) >= self.settings.max_desktops:
            spare = next((s for s in self._spares if not s.ready), self._spares[-1])
            self._spares.remove(spare)
            await self._drop(spare)

    # --- booting ------------------------------------------------------------------------

    def _missing(self) -> tuple[DesktopKind | None, list[_Spare[R]]]:
        """The first kind short of spares, and the spares beyond every kind's target."""
        targets = self.targets()
        have: Counter[DesktopKind] = Counter()
        surplus: list[_Spare[R]] = []
        for spare in self._spares:
            have[spare.kind] += 1
            if have[spare.kind] > targets[spare.kind]:
                surplus.append(spare)
        short = next((kind for kind, n in targets.items() if have[kind] < n), None)
        return short, surplus

    def _hold_back(self) -> str | None:
        """Why no spare may boot now, if something forbids it."""
        in_use, spares = self._hooks.in_use(), len(self._spares)
        if in_use + spares >= self.settings.max_desktops:
            return (
                f"{in_use} desktops and {spares} spares reach CUBICLE_MAX_DESKTOPS "
                f"({self.settings.max_desktops})"
            )
        available = available_memory_mb()
        reserve = self.settings.warm_pool_reserve_mb
        if available is not None and available < reserve:
            return f"MemAvailable {available:.0f} MiB is under the {reserve} MiB reserve"
        return None

    async def _fill(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            short, surplus = self._missing()
            for spare in surplus:
                self._spares.remove(spare)
                await self._drop(spare)
            self._held_back = self._hold_back() if short is not None else None
            if short is None or self._held_back is not None:
                with contextlib.suppress(TimeoutError):  # not wait_for: it may eat a cancel
                    async with asyncio.timeout(_RECHECK_S):
                        await self._wake.wait()
                continue
            desktop = self._hooks.new(short)
            spare = _Spare(short, desktop, asyncio.create_task(self._hooks.boot(desktop)))
            self._spares.append(spare)
            try:
                await asyncio.shield(spare.boot)
                failures = 0
            except asyncio.CancelledError:
                this = asyncio.current_task()
                if not spare.boot.cancelled() or (this is not None and this.cancelling()):
                    raise  # the pool is stopping
                # else `make_room` stopped this spare's boot: carry on
            except Exception as exc:  # the pool keeps trying, more slowly
                self.forget(desktop)
                failures += 1
                pause = min(_BACKOFF_S[0] * 2 ** (failures - 1), _BACKOFF_S[1])
                reason = exc.message if isinstance(exc, CubicleError) else repr(exc)
                log.warning("warm pool: a spare did not boot: %s (retry in %.0f s)", reason, pause)
                await asyncio.sleep(pause)

    async def _drop(self, spare: _Spare[R]) -> None:
        if spare.boot.done():
            if spare.ready:
                await self._hooks.discard(spare.desktop)
            return
        spare.boot.cancel()
        with contextlib.suppress(asyncio.CancelledError, CubicleError):
            await spare.boot
        # A boot cancelled in its warm-up leaves a drawn desktop, its disk mounted: it
        # ends like any spare (one cancelled earlier has nothing left to end).
        await self._hooks.discard(spare.desktop)
