"""Private networks: desktops that reach each other, and nothing else through it.

A network is a Linux bridge in a network namespace the service owns and nothing else is
in (`cubicle-<service>-<name>`): no route leads from it to the host or out. A desktop that
joins gets a veth pair, one end on the bridge, the other in the desktop's own network
namespace as `cubicle0` with an address of the network's /24; its `/etc/hosts` (the
runtime's file, read-only inside) names every member by id and alias, rewritten in place
as desktops join and leave. A desktop on no network, or on another, has no interface on
this bridge: its packets cannot get there.

Only runtimes whose sandboxes have a network namespace on this host can join (`local`);
the service needs CAP_NET_ADMIN (root) to make the namespaces. Networks last as long as
the service: it removes its namespaces when it stops, and those an earlier run left.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cubicle.protocol.errors import Conflict, NotFound, NotSupported
from cubicle.protocol.service import NetworkInfo, NetworkMember
from cubicle.server.events import DesktopEnded, DesktopEvent, Events

log = logging.getLogger("cubicle.networks")

_SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")
"""Where networks' /24 subnets come from."""
MAX_NETWORKS = 250


@dataclass
class _Member:
    desktop_id: str
    alias: str | None
    address: ipaddress.IPv4Address
    hosts_file: Path


@dataclass
class _Network:
    name: str
    namespace: str
    subnet: ipaddress.IPv4Network
    created_at: datetime
    members: dict[str, _Member] = field(default_factory=dict)

    def info(self) -> NetworkInfo:
        return NetworkInfo(
            name=self.name,
            subnet=str(self.subnet),
            desktops=[
                NetworkMember(id=m.desktop_id, alias=m.alias, address=str(m.address))
                for m in self.members.values()
            ],
            created_at=self.created_at,
        )

    def free_address(self) -> ipaddress.IPv4Address:
        taken = {m.address for m in self.members.values()}
        for address in list(self.subnet.hosts())[1:]:  # .1 stays free for a gateway
            if address not in taken:
                return address
        raise Conflict(f"network {self.name} is full ({len(taken)} desktops)")


class NetworkError(Exception):
    """An `ip` command failed."""


async def _ip(*args: str, stdin: str | None = None, namespace: Path | None = None) -> str:
    """Run `ip` (in the network namespace at `namespace`, if given); its output."""
    command = ["ip", *args]
    if namespace is not None:
        command = ["nsenter", f"--net={namespace}", *command]
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate(stdin.encode() if stdin is not None else None)
    if process.returncode != 0:
        raise NetworkError(f"{' '.join(command)}: {err.decode(errors='replace').strip()}")
    return out.decode()


class Networks:
    """The private networks of one service."""

    def __init__(self, data_dir: Path, events: Events) -> None:
        tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]
        self._prefix = f"cubicle-{tag}-"
        """Namespaces of this service (several services may share a host)."""
        self._networks: dict[str, _Network] = {}
        self._lock = asyncio.Lock()
        self._unsubscribe = events.subscribe(self._on_event)
        self._leaving: set[asyncio.Task[None]] = set()

    # --- the service's life ----------------------------------------------------------------

    async def start(self) -> None:
        """Remove the namespaces an earlier run of this service left behind."""
        for name in await self._namespaces():
            await self._delete_namespace(name)

    async def close(self) -> None:
        self._unsubscribe()
        await asyncio.gather(*self._leaving, return_exceptions=True)
        for network in list(self._networks.values()):
            await self._delete_namespace(network.namespace)
        self._networks.clear()

    async def _namespaces(self) -> list[str]:
        try:
            listed = await _ip("netns", "list")
        except NetworkError:
            return []
        names = [line.split()[0] for line in listed.splitlines() if line.strip()]
        return [name for name in names if name.startswith(self._prefix)]

    async def _delete_namespace(self, name: str) -> None:
        try:
            await _ip("netns", "delete", name)
        except NetworkError as exc:
            log.warning("could not remove network namespace %s: %s", name, exc)

    # --- networks --------------------------------------------------------------------------

    def get(self, name: str) -> _Network:
        try:
            return self._networks[name]
        except KeyError:
            raise NotFound(f"no network {name!r}: make it with POST /api/networks") from None

    def infos(self) -> list[NetworkInfo]:
        return [network.info() for network in self._networks.values()]

    def info(self, name: str) -> NetworkInfo:
        return self.get(name).info()

    async def create(self, name: str) -> NetworkInfo:
        async with self._lock:
            if name in self._networks:
                raise Conflict(f"network {name!r} exists already")
            if len(self._networks) >= MAX_NETWORKS:
                raise Conflict(f"this service has {MAX_NETWORKS} networks: delete some first")
            used = {n.subnet for n in self._networks.values()}
            subnet = next(s for s in _SUPERNET.subnets(new_prefix=24) if s not in used)
            namespace = self._prefix + name
            try:
                await _ip("netns", "add", namespace)
            except NetworkError as exc:
                raise NotSupported(
                    "private networks need the service to run as root (CAP_NET_ADMIN) to make "
                    f"network namespaces: {exc}"
                ) from exc
            try:
                await _ip(
                    "-n", namespace, "-batch", "-",
                    stdin="link set lo up\nlink add br0 type bridge\nlink set br0 up\n",
                )  # fmt: skip
            except NetworkError:
                await self._delete_namespace(namespace)
                raise
            network = _Network(name, namespace, subnet, datetime.now(UTC))
            self._networks[name] = network
            log.info("network %s: %s in namespace %s", name, subnet, namespace)
            return network.info()

    async def delete(self, name: str) -> None:
        async with self._lock:
            network = self.get(name)
            if network.members:
                on = ", ".join(sorted(network.members))
                raise Conflict(f"desktops are on network {name!r} ({on}): kill them first")
            del self._networks[name]
            await self._delete_namespace(network.namespace)

    def check_can_join(self, names: list[str], alias: str | None) -> None:
        """Refuse a create whose networks do not exist or whose alias is taken (before the
        desktop starts)."""
        for name in names:
            network = self.get(name)
            if alias is not None and any(
                alias in (m.alias, m.desktop_id) for m in network.members.values()
            ):
                raise Conflict(f"alias {alias!r} is taken on network {name!r}")

    # --- desktops ----------------------------------------------------------------------------

    async def join(
        self, desktop_id: str, names: list[str], alias: str | None, pid: int, hosts_file: Path
    ) -> None:
        """Plug the desktop whose network namespace is process `pid`'s into each network."""
        namespace = Path(f"/proc/{pid}/ns/net")
        async with self._lock:
            self.check_can_join(names, alias)
            for index, name in enumerate(names):
                network = self.get(name)
                address = network.free_address()
                outside, inside = f"cb{index}-{desktop_id[:10]}", f"cubicle{index}"
                await _ip(
                    "-n", network.namespace, "link", "add", outside, "type", "veth",
                    "peer", "name", inside, "netns", str(pid),
                )  # fmt: skip
                await _ip("-n", network.namespace, "link", "set", outside, "master", "br0", "up")
                await _ip(
                    "-batch", "-",
                    stdin=f"addr add {address}/{network.subnet.prefixlen} dev {inside}\n"
                    f"link set {inside} up\nlink set lo up\n",
                    namespace=namespace,
                )  # fmt: skip
                network.members[desktop_id] = _Member(desktop_id, alias, address, hosts_file)
                log.info("desktop %s joined network %s as %s", desktop_id, name, address)
            await self._write_hosts(names)

    def _on_event(self, event: DesktopEvent) -> None:
        if isinstance(event, DesktopEnded):
            left = [n.name for n in self._networks.values() if event.desktop_id in n.members]
            if left:
                task = asyncio.get_running_loop().create_task(self._leave(event.desktop_id, left))
                self._leaving.add(task)
                task.add_done_callback(self._leaving.discard)

    async def _leave(self, desktop_id: str, names: list[str]) -> None:
        """A desktop ended: its end of each veth went with its namespace; free its address
        and tell the others."""
        async with self._lock:
            for name in names:
                if (network := self._networks.get(name)) is not None:
                    network.members.pop(desktop_id, None)
            await self._write_hosts(names)

    async def _write_hosts(self, names: list[str]) -> None:
        """Rewrite the hosts file of every member of these networks (in place: it is
        bind-mounted by inode) with the members of every network it is on."""
        affected = {
            member.desktop_id: member
            for name in names
            if (network := self._networks.get(name)) is not None
            for member in network.members.values()
        }
        files: dict[Path, list[str]] = {}
        for desktop_id, member in affected.items():
            files[member.hosts_file] = [
                f"{m.address} {m.desktop_id}" + (f" {m.alias}" if m.alias else "")
                for network in self._networks.values()
                if desktop_id in network.members
                for m in network.members.values()
            ]
        await asyncio.to_thread(_rewrite_hosts, files)


_MARK = "# cubicle networks\n"


def _rewrite_hosts(files: dict[Path, list[str]]) -> None:
    for path, lines in files.items():
        try:
            with path.open("r+") as file:
                own = file.read().split(_MARK)[0]
                file.seek(0)
                file.write(own + _MARK + "".join(f"{line}\n" for line in dict.fromkeys(lines)))
                file.truncate()
        except FileNotFoundError:
            continue  # the desktop ended meanwhile
