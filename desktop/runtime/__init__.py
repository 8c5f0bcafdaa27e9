"""Runtimes: how a desktop's sandbox is made (`base.Runtime`), by name.

`RUNTIMES` maps each name to a factory that builds the runtime from the service's settings;
a module's own imports load only when its runtime is first used.
"""

from __future__ import annotations

from collections.abc import Callable

from desktop.protocol.errors import InvalidRequest
from desktop.runtime.base import Found, NodePlace, Runtime, Sandbox, SandboxSpec
from desktop.settings import Settings

RuntimeFactory = Callable[[Settings], Runtime]


def _local(settings: Settings) -> Runtime:
    from desktop.runtime.local import LocalRuntime

    return LocalRuntime(settings.data_dir, max_sandboxes=settings.max_desktops)


def _ray(settings: Settings) -> Runtime:
    from desktop.runtime.raycluster import RayRuntime

    return RayRuntime(settings)


def _microvm(settings: Settings) -> Runtime:
    from desktop.runtime.microvm.runtime import MicroVmRuntime

    return MicroVmRuntime(
        settings.data_dir,
        images_dir=settings.images_dir,
        max_sandboxes=settings.max_desktops,
        hang_s=settings.microvm_hang_s,
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
