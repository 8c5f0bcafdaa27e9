"""A microVM's network when it asks for one (`network: true`): who carries its packets.

The VM has a virtio-net device whose backend is an `Egress`: something that starts beside
QEMU and hands it the `-netdev net` arguments. The one here is passt, a user-mode network
stack in a process of its own (no privileges, no tap device), under the same egress policy
as the local runtime's slirp4netns (`cubicle/server/runtime/egress.py`: every connection and
datagram passt sends out is answered by the operator's lists; this host, its networks and
cloud metadata are refused). The gateway address is not the host (`--no-map-gw`).

The guest's side is fixed, so that templates and forks agree: 10.0.2.15/24, gateway
10.0.2.2, DNS 10.0.2.3 (forwarded to the host's resolver).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Protocol

from cubicle.protocol.errors import SandboxStartError
from cubicle.server.runtime.network import EGRESS_SCRIPT, EgressRules, stop_supervisor

GUEST_ADDRESS = "10.0.2.15"
GATEWAY = "10.0.2.2"
DNS = "10.0.2.3"


class Egress(Protocol):
    async def start(self, directory: Path) -> tuple[tuple[str, ...], int]:
        """Start the backend; return QEMU's `-netdev` arguments for a netdev named `net`
        and a descriptor QEMU must inherit for them (the caller closes it once passed)."""
        ...

    async def stop(self) -> None:
        """End the backend; idempotent."""
        ...


class PasstEgress:
    """passt for this VM alone, joined to QEMU by a socket pair (no path to reach it),
    under the egress supervisor with the operator's `rules`."""

    def __init__(self, rules: EgressRules) -> None:
        self._rules = rules
        self._process: asyncio.subprocess.Process | None = None

    async def start(self, directory: Path) -> tuple[tuple[str, ...], int]:
        if shutil.which("passt") is None:
            raise SandboxStartError(
                "network: true in a microVM needs passt: run "
                "`CUBICLE_RUNTIME=microvm scripts/bootstrap.sh`"
            )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log_fd = os.open(directory / "egress.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", str(EGRESS_SCRIPT), "--policy", self._rules.to_json(), "--",
                "passt", "--foreground", "--quiet", "--one-off", "--ipv4-only",
                "--fd", str(ours.fileno()),
                "--address", GUEST_ADDRESS, "--netmask", "24", "--gateway", GATEWAY,
                "--no-map-gw", "--dns", DNS, "--dns-forward", DNS,
                "--tcp-ports", "none", "--udp-ports", "none",
                pass_fds=(ours.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
            )  # fmt: skip
        except BaseException:
            theirs.close()
            raise
        finally:
            ours.close()
            os.close(log_fd)
        fd = theirs.detach()
        return ("-netdev", f"stream,id=net,server=off,addr.type=fd,addr.str={fd}"), fd

    async def stop(self) -> None:
        process, self._process = self._process, None
        await stop_supervisor(process)


DETACHED = ("-netdev", "user,id=net,restrict=on")
"""A backend for a VM that never runs (a snapshot being converted): no traffic at all."""
