"""A desktop's user-mode network: slirp4netns, unprivileged, under the egress policy.

The sandbox's network namespace belongs to a user namespace that the desktop's own host
user made (`unshare --user --net`, see `cubicle.server.runtime.bwrap`), so slirp4netns enters it
as that user, without root. It runs under `cubicle/server/runtime/egress.py`, which answers every
connection and datagram it sends out with the operator's policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cubicle.protocol.errors import SandboxStartError
from cubicle.server.runtime import egress
from cubicle.server.runtime.base import SandboxEgress

EGRESS_SCRIPT = Path(egress.__file__)
"""Run as a script (not `-m`), so that it starts without the service's packages."""


@dataclass(frozen=True)
class EgressRules:
    """The operator's lists (`CUBICLE_EGRESS_ALLOW`, `CUBICLE_EGRESS_DENY`): CIDRs."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"allow": list(self.allow), "deny": list(self.deny)})


BUILT_IN = EgressRules()
"""The built-in policy alone, without operator lists."""


class UserNetwork:
    """slirp4netns for one sandbox, and the egress supervisor above it."""

    def __init__(self, rules: EgressRules, log_fd: int, desktop_rules: Path) -> None:
        self._rules = rules
        self._log_fd = log_fd
        self._desktop_rules = desktop_rules
        """The desktop's own rules (`set_rules`), which the supervisor rereads as they change."""
        self._process: asyncio.subprocess.Process | None = None

    async def start(self, sandbox_pid: int, host_uid: int | None) -> None:
        """Attach a network to the namespaces of `sandbox_pid` (bwrap, started through
        `unshare --user --net`); returns once the desktop's interface is configured."""
        ready_r, ready_w = os.pipe()
        slirp = [
            "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
            "--enable-seccomp", f"--ready-fd={ready_w}",
            f"--userns-path=/proc/{sandbox_pid}/ns/user",
            "--netns-type=path", f"/proc/{sandbox_pid}/ns/net", "tap0",
        ]  # fmt: skip
        if not self._desktop_rules.exists():
            self.set_rules(SandboxEgress())
        rules_fd = os.open(self._desktop_rules, os.O_RDONLY | os.O_CLOEXEC)
        command = [sys.executable, "-I", str(EGRESS_SCRIPT), "--policy", self._rules.to_json()]
        command += ["--rules-fd", str(rules_fd)]
        if host_uid is not None:
            command += ["--uid", str(host_uid)]
        try:
            self._process = await asyncio.create_subprocess_exec(
                *command, "--", *slirp,
                pass_fds=(ready_w, rules_fd),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=self._log_fd,
                stderr=self._log_fd,
            )  # fmt: skip
        finally:
            os.close(ready_w)
            os.close(rules_fd)
        try:
            ready = await asyncio.wait_for(asyncio.to_thread(os.read, ready_r, 1), 10)
        except TimeoutError:
            ready = b""
        finally:
            os.close(ready_r)
        if ready != b"1":
            await self.stop()
            raise SandboxStartError(
                "slirp4netns did not bring up the desktop's network (see sandbox.log; "
                "is slirp4netns installed? scripts/bootstrap.sh installs it)"
            )

    def set_rules(self, rules: SandboxEgress) -> None:
        """The desktop's own rules from now on: the file is rewritten in place (the
        supervisor holds it open), and its next decision reads them."""
        data = rules.to_json().encode()
        fd = os.open(self._desktop_rules, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # written over, then cut: a read in between sees invalid JSON, never none
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    async def stop(self) -> None:
        """End slirp4netns and its supervisor; idempotent."""
        process, self._process = self._process, None
        await stop_supervisor(process)


async def stop_supervisor(process: asyncio.subprocess.Process | None) -> None:
    """End an egress supervisor and the command under it (it SIGKILLs the command on
    SIGTERM, then returns); SIGKILL it after 3 s."""
    if process is None or process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), 3)
    except TimeoutError:
        process.kill()
        await process.wait()
