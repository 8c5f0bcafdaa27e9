"""What every runtime provides: start a sandbox, hand back its guest endpoint, stop it.

Health, timeouts, the warm pool and bookkeeping live once in `cubicle.server.manager`, above all
runtimes. A runtime registers itself by name in `cubicle.server.runtime.RUNTIMES`; the service
picks one with `CUBICLE_RUNTIME` (or per desktop, `"runtime"` at create).
"""

from __future__ import annotations

import abc
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cubicle.protocol.errors import Conflict, NotSupported
from cubicle.protocol.models import GuestEvent
from cubicle.protocol.service import SnapshotInfo
from cubicle.server.guest_client import GuestEndpoint


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
    secret: str | None = None
    """A bearer token the guest demands on every request, when set: the runtime hands it to
    the guest daemon, never to the desktop's programs (runtimes whose guest is reachable
    from other hosts set it)."""
    node_labels: tuple[tuple[str, str], ...] = ()
    """Labels the node that holds the desktop must carry (runtimes that place desktops on
    a cluster's nodes honour them)."""
    snapshot: str | None = None
    """Start from this named snapshot instead of a fresh desktop (runtimes that have them)."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables every program in the desktop gets (a secret's placeholder)."""
    hosts: tuple[tuple[str, str], ...] = ()
    """Host names and the addresses the desktop's /etc/hosts gives them."""
    trust_pem: bytes | None = None
    """A certificate authority the desktop trusts besides the system's (its egress proxy's)."""
    volumes: tuple[tuple[str, str, bool], ...] = ()
    """Host directories (mounted volumes) to bind in: (host path, path inside, read-only)."""
    disk_image: Path | None = None
    """Start from what `Sandbox.park` kept (a disk image, and where the runtime can, the
    memory too), which the runtime takes over: a parked desktop, resumed."""


@dataclass(frozen=True)
class NodePlace:
    """Which machine of a cluster holds a sandbox."""

    id: str
    """The cluster's id of the node."""
    address: str
    """The node's IP address."""


@dataclass(frozen=True)
class SandboxEgress:
    """A desktop's own egress rules as its runtime applies them."""

    allow: tuple[str, ...] = ()
    """CIDRs: when `restricted`, the only addresses reached other than through the proxy."""
    deny: tuple[str, ...] = ()
    """CIDRs never reached."""
    restricted: bool = False
    """The desktop has an allowlist (CIDRs, host names or both)."""
    proxy: tuple[int, str] | None = None
    """The egress proxy that carries its connections to ports 80 and 443, and the
    desktop's token with it (`cubicle.server.outbound`): port on this host's loopback."""

    def to_json(self) -> str:
        proxy = {"port": self.proxy[0], "token": self.proxy[1]} if self.proxy else None
        return json.dumps(
            {
                "allow": list(self.allow),
                "deny": list(self.deny),
                "restricted": self.restricted,
                "proxy": proxy,
            }
        )


@dataclass(frozen=True)
class Usage:
    """What a sandbox uses, read at one moment (`Sandbox.usage`)."""

    cpu_s: float | None
    """CPU time all its processes used since it started, seconds; None where unknown."""
    memory_bytes: int
    """Memory charged to it now, page cache included."""
    memory_cache_bytes: int
    """The page cache part of it."""
    disk_bytes: int | None
    """Disk its own writes take now; None where unknown."""
    net_rx_bytes: int | None = None
    """Bytes received over its network since it started; None without one."""
    net_tx_bytes: int | None = None


class Sandbox(abc.ABC):
    """A started sandbox: where its guest listens, its progress, and how to end it."""

    id: str
    endpoint: GuestEndpoint
    """Where the control plane reaches the sandbox's guest daemon."""
    node: NodePlace | None = None
    """The cluster node that holds it; None for a sandbox on the service's own host."""
    draw_timeout_s: float | None = None
    """Seconds its desktop may take to be drawn where the runtime knows better than the
    service's `start_timeout_s` (a microVM booting cold: a minute and more under TCG)."""
    detached: bool = False
    """Whether it outlives the service: the manager lets go of it when the service stops
    (a later service finds it again through `Runtime.recover`) instead of ending it."""

    def set_egress(self, rules: SandboxEgress) -> None:
        """The desktop's own egress rules from its next connection on: they narrow the
        operator's policy; `NotSupported` where the runtime cannot."""
        raise NotSupported(
            "this runtime has no per-desktop egress rules yet: use the local runtime"
        )

    def network_namespace(self) -> tuple[int, Path] | None:
        """A process whose network namespace is the sandbox's, on this host, and the file
        the sandbox reads as /etc/hosts: what joining a private network needs
        (`cubicle.server.networks`). None for runtimes whose sandboxes cannot join."""
        return None

    def kept(self, timeout_s: int, created_at: datetime) -> None:  # noqa: B027
        """The manager's idle timeout for it from now on, in seconds (0: it waits in the
        warm pool), and when it was handed out. A detached sandbox keeps them, to stop by
        itself when no service came back within the timeout, and to be found again as it
        was (other sandboxes ignore them)."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[GuestEvent]:
        """The guest's progress events until it stops reporting."""

    @abc.abstractmethod
    async def wait(self) -> str:
        """Wait until the sandbox has ended; returns why, in words."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """End the sandbox and everything in it, and free its resources; idempotent."""

    def usage(self) -> Usage | None:
        """What it uses now (blocking: file reads); None where the runtime cannot say."""
        return None

    async def pause(self) -> None:
        """Stop everything in the sandbox where it stands, memory kept, until `resume`:
        no CPU is used meanwhile. `NotSupported` where the runtime cannot."""
        raise NotSupported(
            "this runtime cannot pause desktops yet: use the local or microvm runtime"
        )

    async def park(self, *, keep_memory: bool = False) -> Path:
        """Stop the sandbox but keep its disk, and with `keep_memory` its memory as well
        (runtimes with `Runtime.parks_memory`): returns what to start it again from
        (`SandboxSpec.disk_image`). `NotSupported` where the runtime cannot."""
        raise NotSupported(
            "this runtime cannot pause desktops without their memory: "
            "use the local or microvm runtime"
        )

    async def resume(self) -> None:
        """Let a paused sandbox run on from where it stopped."""
        raise NotSupported(
            "this runtime cannot pause desktops yet: use the local or microvm runtime"
        )

    async def foreground(self) -> None:  # noqa: B027 - runtimes without priorities ignore it
        """Raise a sandbox started `nice` to normal priority; idempotent."""

    @abc.abstractmethod
    def pids(self) -> list[int]:
        """Host process ids of everything running in the sandbox (for measurements)."""


class Runtime(abc.ABC):
    """Starts sandboxes of one kind."""

    name: str
    places_on_nodes: bool = False
    """Whether it places sandboxes on a cluster's nodes, honouring `SandboxSpec.node_labels`."""
    desktop_egress: bool = False
    """Whether its sandboxes take egress rules of their own (`Sandbox.set_egress`)."""
    joins_networks: bool = False
    """Whether its sandboxes can join private networks (`Sandbox.network_namespace`)."""
    can_pause: bool = False
    """Whether its sandboxes pause and resume (`Sandbox.pause`)."""
    parks_memory: bool = False
    """Whether `Sandbox.park` can keep memory: a desktop paused with its memory then
    outlives the service, its programs running on when resumed by the next one."""
    mounts_volumes: bool = False
    """Whether its sandboxes take volumes (`SandboxSpec.volumes`, host directories)."""
    snapshots_memory: bool = False
    """Whether its snapshots (and so its forks) keep memory: running programs come back."""
    disks_on_this_host: bool = True
    """Whether its desktops' disks are sparse files in this service's data directory (an
    upload then checks the host has room for it, not only the desktop's own disk)."""

    @abc.abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox; returns once it is spawned, before the desktop is ready."""

    async def recover(self) -> list[Found]:
        """Sandboxes an earlier service left running (detached ones), to be managed again."""
        return []

    async def snapshot(self, sandbox: Sandbox, name: str) -> SnapshotInfo:
        """Save a running sandbox as snapshot `name`; `Conflict` where the runtime has none."""
        raise Conflict(
            f"desktop {sandbox.id} runs in the {self.name} runtime, which has no snapshots: "
            "create it with runtime local or microvm"
        )

    def snapshots(self) -> list[SnapshotInfo]:
        """Its named snapshots."""
        return []

    async def delete_snapshot(self, name: str) -> bool:
        """Delete its snapshot `name`; False if it has none of that name."""
        return False

    async def close(self) -> None:  # noqa: B027 - most runtimes hold nothing of their own
        """Release what the runtime itself holds (not its sandboxes); idempotent."""


@dataclass(frozen=True)
class Found:
    """A sandbox still running from an earlier service, as its runtime found it again."""

    sandbox: Sandbox
    spec: SandboxSpec
    timeout_s: int
    """Its idle timeout in seconds, as last `kept`; 0: it waited in the warm pool."""
    created_at: datetime
    """When it was handed out, as last `kept`."""
