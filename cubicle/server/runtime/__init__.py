"""Runtimes: how a desktop's sandbox is made (`base.Runtime`), by name.

`RUNTIMES` maps each name to a factory that builds the runtime from the service's settings;
a module's own imports load only when its runtime is first used.
"""

from __future__ import annotations

from collections.abc import Callable

from cubicle.protocol.errors import InvalidRequest
from cubicle.server.runtime.base import Found, NodePlace, Runtime, Sandbox, SandboxSpec
from cubicle.server.settings import Settings

RuntimeFactory = Callable[[Settings], Runtime]


def _local(settings: Settings) -> Runtime:
    from cubicle.server.runtime.local import Hardening, LocalRuntime
    from cubicle.server.runtime.network import EgressRules

    hardening = Hardening(
        unsafe_no_limits=settings.unsafe_no_limits,
        off=settings.unsafe_no_hardening,
        total_memory_mb=settings.desktops_memory_mb(),
        total_pids=settings.total_pids,
        cpu_cap=settings.cpu_cores is not None,
        spare_disk_mb=settings.disk_mb,
        egress=EgressRules(settings.egress_allow, settings.egress_deny),
    )
    return LocalRuntime(settings.data_dir, max_sandboxes=settings.max_desktops, hardening=hardening)


def _ray(settings: Settings) -> Runtime:
    from cubicle.server.runtime.raycluster import RayRuntime

    return RayRuntime(settings)


def _microvm(settings: Settings) -> Runtime:
    from cubicle.server.runtime.microvm.runtime import MicroVmRuntime
    from cubicle.server.runtime.network import EgressRules

    return MicroVmRuntime(
        settings.data_dir,
        images_dir=settings.images_dir,
        max_sandboxes=settings.max_desktops,
        hang_s=settings.microvm_hang_s,
        egress=EgressRules(settings.egress_allow, settings.egress_deny),
    )


RUNTIMES: dict[str, RuntimeFactory] = {"local": _local, "microvm": _microvm, "ray": _ray}
"""Runtime name → its factory."""


def make_runtime(name: str, settings: Settings) -> Runtime:
    """Build the runtime called `name`; `InvalidRequest` names the ones there are."""
    try:
        factory = RUNTIMES[name]
    except KeyError:
        known = ", ".join(sorted(RUNTIMES))
        raise InvalidRequest(f"unknown runtime {name!r}: use one of {known}") from None
    return factory(settings)


__all__ = [
    "RUNTIMES",
    "Found",
    "NodePlace",
    "Runtime",
    "RuntimeFactory",
    "Sandbox",
    "SandboxSpec",
    "make_runtime",
]
