"""One QEMU microVM: its command line, its process, and its monitor (QMP).

The machine is QEMU's `microvm`: no PCI, no firmware, virtio-mmio devices only. The
kernel and initrd boot directly; the disks are the image's read-only root and guest
layers plus the desktop's own copy-on-write disk; a virtio-serial port, joined to a Unix
socket in the desktop's private directory, is the only way in (`network=False` means no
network device at all). Guest RAM is a memory-backend-file: a template maps its file
shared (so the file *is* its memory once saved); desktops map the template's file
privately, so they share its unchanged pages through the page cache and write their own.
QEMU runs confined by its seccomp sandbox (no spawning, no privilege changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cubicle.protocol.errors import SandboxError, SandboxStartError
from cubicle.server.runtime.microvm.image import Image

log = logging.getLogger("cubicle.runtime.microvm")

QEMU = "qemu-system-x86_64"
PORT_NAME = "cubicle.0"
"""The virtio-serial port's name; the VM agent finds its device by it."""
Accel = Literal["kvm", "tcg"]


class QmpError(SandboxError):
    """QEMU's monitor refused a command or went away."""

    code = "qemu_monitor_error"


@dataclass(frozen=True)
class Machine:
    """What one VM is made of."""

    image: Image
    memory_mb: int
    cpus: int
    network: bool
    data_disk: Path
    """The desktop's own disk (home, /tmp): raw for a template, qcow2 over it for a desktop."""
    memory_file: Path
    shared_memory: bool
    """True for a template being made (its RAM is the file), False for a desktop."""
    directory: Path
    """Private directory of the VM's sockets and console log."""
    accel: Accel
    incoming_fd: int | None = None
    """A file descriptor of a saved state to start from (`-incoming defer` then QMP)."""
    netdev: tuple[str, ...] = ()
    """With `network`: the `-netdev` arguments of its backend (`network.Egress`)."""
    net_fd: int | None = None
    """A descriptor those arguments name, for QEMU to inherit."""

    @property
    def channel_socket(self) -> Path:
        return self.directory / "channel.sock"

    @property
    def qmp_socket(self) -> Path:
        return self.directory / "qmp.sock"

    @property
    def console_log(self) -> Path:
        return self.directory / "console.log"

    def argv(self) -> list[str]:
        image, d = self.image, self.directory
        disk_format = "raw" if self.data_disk.suffix == ".raw" else "qcow2"
        cmdline = (
            "console=ttyS0 root=LABEL=cubicle-root ro rootfstype=ext4 init=/sbin/cubicle-init "
            "quiet loglevel=3 panic=-1 tsc=reliable random.trust_cpu=on"
        )
        if self.accel == "tcg" and (khz := host_tsc_khz()):
            # Under TCG the guest's TSC ticks at the host's rate, and microvm has no timer
            # to measure it against: a busy host makes the calibration fail and the
            # kernel crawl on jiffies. Tell it the rate.
            cmdline += f" tsc_early_khz={khz}"
        accel = ["-accel", "kvm", "-cpu", "host"] if self.accel == "kvm" else [
            "-accel", "tcg,thread=multi,tb-size=256", "-cpu", "max",
        ]  # fmt: skip
        argv = [
            QEMU,
            "-name", f"cubicle-{d.name}",
            "-M", "microvm,acpi=on,memory-backend=mem",
            *accel,
            "-smp", str(self.cpus),
            "-m", f"{self.memory_mb}M",
            "-object",
            f"memory-backend-file,id=mem,size={self.memory_mb}M,mem-path={self.memory_file},"
            f"share={'on' if self.shared_memory else 'off'}",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-serial", f"file:{self.console_log}",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", cmdline,
            "-drive", f"id=root,file={image.rootfs},format=raw,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=root",
            "-drive", f"id=guest,file={image.guest_disk},format=raw,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=guest",
            "-drive", f"id=data,file={self.data_disk},format={disk_format},if=none,discard=unmap",
            "-device", "virtio-blk-device,drive=data",
            "-device", "virtio-serial-device,max_ports=2",
            "-chardev", f"socket,id=channel,path={self.channel_socket},server=on,wait=off",
            "-device", f"virtserialport,chardev=channel,name={PORT_NAME}",
            "-object", "rng-random,id=rng,filename=/dev/urandom",
            "-device", "virtio-rng-device,rng=rng",
            "-qmp", f"unix:{self.qmp_socket},server=on,wait=off",
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ]  # fmt: skip
        if self.network:
            if not self.netdev:
                raise SandboxStartError("a VM with a network needs a network backend")
            argv += [*self.netdev, "-device", "virtio-net-device,netdev=net"]
        if self.incoming_fd is not None:
            argv += ["-incoming", "defer"]
        return argv


def host_tsc_khz() -> int | None:
    """The host's TSC rate in kHz, when the CPU says it is constant (else None)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split()
    mhz = next((ln for ln in text.splitlines() if ln.startswith("cpu MHz")), "")
    if "constant_tsc" not in flags or ":" not in mhz:
        return None
    return round(float(mhz.split(":")[1]) * 1000)


class Qmp:
    """A connection to one QEMU's monitor: commands in, answers out, events set aside."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, path: Path, process: asyncio.subprocess.Process) -> Qmp:
        reader, writer = await _connect_unix(path, process)
        qmp = cls(reader, writer)
        await qmp._read()  # the greeting
        await qmp.execute("qmp_capabilities")
        return qmp

    async def _read(self) -> dict[str, Any]:
        while True:
            line = await self._reader.readline()
            if not line:
                raise QmpError("QEMU's monitor closed (QEMU exited)")
            message = json.loads(line)
            if "event" not in message:
                return message

    async def execute(self, command: str, **arguments: Any) -> Any:
        async with self._lock:
            request = {"execute": command, **({"arguments": arguments} if arguments else {})}
            self._writer.write(json.dumps(request).encode() + b"\n")
            await self._writer.drain()
            answer = await self._read()
        if "error" in answer:
            raise QmpError(f"QEMU refused {command}: {answer['error'].get('desc')}")
        return answer.get("return")

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()


async def _connect_unix(
    path: Path, process: asyncio.subprocess.Process, timeout_s: float = 20.0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a socket QEMU is about to create; fail early if QEMU exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await asyncio.open_unix_connection(str(path), limit=1 << 20)
        except (FileNotFoundError, ConnectionRefusedError):
            if process.returncode is not None:
                raise SandboxStartError(f"QEMU exited with status {process.returncode}") from None
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"QEMU did not open {path.name} in {timeout_s:.0f} s"
                ) from None
            await asyncio.sleep(0.002)


class Vm:
    """A running QEMU process and its monitor."""

    def __init__(self, machine: Machine, process: asyncio.subprocess.Process, qmp: Qmp) -> None:
        self.machine = machine
        self.process = process
        self.qmp = qmp

    @classmethod
    async def start(cls, machine: Machine, *, run: bool = True, ignore_shared: bool = True) -> Vm:
        """Start QEMU; with a saved state to load, load it and run it unless `run` is False.

        `ignore_shared` must match how the state was saved (see `save`)."""
        log_fd = os.open(machine.directory / "qemu.log", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                # QEMU dies with the service, whatever kills the service.
                *("setpriv", "--pdeathsig", "KILL", "--", *machine.argv()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                pass_fds=tuple(
                    fd for fd in (machine.incoming_fd, machine.net_fd) if fd is not None
                ),
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise SandboxStartError(
                f"{QEMU} is not installed: run `CUBICLE_RUNTIME=microvm scripts/bootstrap.sh`"
            ) from exc
        finally:
            os.close(log_fd)
        vm = None
        try:
            qmp = await Qmp.connect(machine.qmp_socket, process)
            vm = cls(machine, process, qmp)
            if machine.incoming_fd is not None:
                await qmp.execute(
                    "migrate-set-capabilities",
                    capabilities=[{"capability": "x-ignore-shared", "state": ignore_shared}],
                )
                await qmp.execute("migrate-incoming", uri=f"fd:{machine.incoming_fd}")
                await vm._resume_after_incoming(run=run)
        except (QmpError, ConnectionError) as exc:
            exited = process.returncode is not None
            await _kill(process)
            if vm is not None and exited:
                raise SandboxStartError(vm.exit_reason()) from exc
            raise
        except BaseException:
            await _kill(process)
            raise
        return vm

    async def _resume_after_incoming(self, *, run: bool, timeout_s: float = 120.0) -> None:
        """Wait until the saved state is loaded, then run (a state saved paused stays
        paused: QEMU only starts by itself what was running when saved)."""
        deadline = time.monotonic() + timeout_s
        while (status := (await self.qmp.execute("query-migrate")).get("status")) != "completed":
            if status in ("failed", "cancelled"):
                raise SandboxStartError(f"loading the snapshot's state {status}")
            if time.monotonic() > deadline:
                raise SandboxStartError(f"the snapshot's state did not load in {timeout_s:.0f} s")
            await asyncio.sleep(0.002)
        running = (await self.qmp.execute("query-status")).get("running")
        if run and not running:
            await self.qmp.execute("cont")
        elif running and not run:
            await self.qmp.execute("stop")

    def exit_reason(self) -> str:
        """Why QEMU ended, from its status and the last lines it or the VM's console wrote."""
        code = self.process.returncode
        what = f"QEMU was killed by signal {-code}" if code and code < 0 else (
            f"QEMU exited with status {code}"
        )  # fmt: skip
        for path in (self.machine.directory / "qemu.log", self.machine.console_log):
            with contextlib.suppress(OSError):
                lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
                tail = [ln for ln in lines if ln][-2:]
                if tail:
                    what += f" ({path.name}: {' / '.join(tail)})"
        return what

    def console_tail(self, lines: int = 3) -> str:
        """The VM console's last lines, for error messages."""
        try:
            text = self.machine.console_log.read_text(errors="replace")
        except OSError:
            return "no console output"
        tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return "console: " + (" / ".join(tail) if tail else "nothing")

    async def save(self, target: Path, *, resume: bool = False, ignore_shared: bool = True) -> None:
        """Pause the VM and write its state to `target`; resume it afterwards when asked.

        With `ignore_shared`, RAM mapped shared from a file is left out (the file holds it);
        without, every page goes into the stream."""
        server_path = self.machine.directory / "migrate.sock"
        done = asyncio.get_running_loop().create_future()

        async def receive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                with target.open("wb") as out:
                    while chunk := await reader.read(1 << 20):
                        await asyncio.to_thread(out.write, chunk)
                done.set_result(None)
            except BaseException as exc:
                done.set_exception(exc)
                raise
            finally:
                writer.close()

        server = await asyncio.start_unix_server(receive, str(server_path))
        try:
            await self.qmp.execute("stop")
            await self.qmp.execute(
                "migrate-set-capabilities",
                capabilities=[{"capability": "x-ignore-shared", "state": ignore_shared}],
            )
            await self.qmp.execute("migrate", uri=f"unix:{server_path}")
            while True:
                status = (await self.qmp.execute("query-migrate")).get("status")
                if status == "completed":
                    break
                if status in ("failed", "cancelled"):
                    raise SandboxError(f"saving the VM's state {status}")
                await asyncio.sleep(0.02)
            await asyncio.wait_for(done, 30)
            if resume:
                await self.qmp.execute("cont")
        finally:
            server.close()
            await server.wait_closed()
            server_path.unlink(missing_ok=True)

    async def stop(self) -> None:
        """End QEMU (it holds no state worth a clean shutdown); idempotent."""
        await self.qmp.close()
        await _kill(self.process)


async def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


_accel: Accel | None = None


async def probe_accel(image: Image, directory: Path) -> Accel:
    """KVM when a tiny boot under it finishes, else TCG; tried once per process.

    /dev/kvm may open and still hang every guest (nested virtualisation turned off): the
    probe boots the image's kernel with no root filesystem under KVM, which panics and
    exits (`-no-reboot`) within a second where KVM works.
    """
    global _accel
    if _accel is not None:
        return _accel
    _accel = "tcg"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        log.info("microVM: /dev/kvm is not usable here: QEMU runs with TCG (slower)")
        return _accel
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    argv = [
        QEMU, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "128M",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-serial", f"file:{directory / 'kvm-probe.log'}",
        "-kernel", str(image.kernel), "-append", "console=ttyS0 panic=-1 root=/dev/null",
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        await asyncio.wait_for(process.wait(), 8)
        console = (directory / "kvm-probe.log").read_text(errors="replace")
        if "Kernel panic" in console or "Linux version" in console:
            _accel = "kvm"
    except TimeoutError:
        pass
    finally:
        await _kill(process)
    if _accel == "kvm":
        log.info("microVM: KVM works here: VMs run with hardware virtualisation")
    else:
        log.warning(
            "microVM: /dev/kvm is there but a test guest did not boot under KVM: "
            "QEMU runs with TCG (slower)"
        )
    return _accel
