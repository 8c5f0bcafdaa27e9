"""What every runtime provides: start a sandbox, hand back its guest endpoint, stop it.

Health, timeouts, the warm pool and bookkeeping live once in `desktop.manager`, above all
runtimes. A runtime registers itself by name in `desktop.runtime.RUNTIMES`; the service
picks one with `CUBICLE_RUNTIME` (or per desktop, `"runtime"` at create).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass

from desktop.guest_client import GuestEndpoint
from desktop.protocol.models import GuestEvent


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox should be."""

    id: str
    width: int
    """Screen pixels."""
    height: int
    """Screen pixels."""
    network: bool
    memory_mb: int
    """Memory limit in MiB for everything inside the sandbox."""
    max_pids: int
    """Most processes and threads inside the sandbox."""
    cpu_cores: float | None
    """CPU time the sandbox may use, in cores; None for no hard cap (equal CPU weight)."""
    disk_mb: int
    """Disk the sandbox may fill (home, /tmp, uploads), in MiB."""
    max_file_bytes: int
    """Largest file the guest accepts through the files API, in bytes."""
    nice: int = 0
    """CPU niceness to boot at (a warm pool's spare: 19), until `Sandbox.foreground()`;
    runtimes that cannot lower a sandbox's priority ignore it."""


class Sandbox(abc.ABC):
    """A started sandbox: where its guest listens, its progress, and how to end it."""

    id: str
    endpoint: GuestEndpoint
    """Where the control plane reaches the sandbox's guest daemon."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[GuestEvent]:
        """The guest's progress events until it stops reporting."""

    @abc.abstractmethod
    async def wait(self) -> str:
        """Wait until the sandbox has ended; returns why, in words."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """End the sandbox and everything in it, and free its resources; idempotent."""

    async def foreground(self) -> None:  # noqa: B027 - runtimes without priorities ignore it
        """Raise a sandbox started `nice` to normal priority; idempotent."""

    @abc.abstractmethod
    def pids(self) -> list[int]:
        """Host process ids of everything running in the sandbox (for measurements)."""


class Runtime(abc.ABC):
    """Starts sandboxes of one kind."""

    name: str

    @abc.abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox; returns once it is spawned, before the desktop is ready."""

    async def close(self) -> None:  # noqa: B027 - most runtimes hold nothing of their own
        """Release what the runtime itself holds (not its sandboxes); idempotent."""
