"""Attacks from inside a desktop: each one fails, and the desktop, a neighbour and the
service keep answering. Runs as root and as a non-root user (`test_nonroot.py`)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from cubicle.server.runtime import cgroups, egress
from tests.conftest import wait_until
from tests.security.attack import create, probe, run, still_answering
from tests.security.conftest import VICTIM


def test_the_kernels_riskiest_calls_are_closed(api, victim, neighbour):
    found = probe(api, victim["id"], "kernel")
    assert found["unshare_user"] == "EPERM"  # no uid 0 in a nested user namespace
    assert found["unshare_net"] == "EPERM"
    assert found["io_uring_setup"] == "ENOSYS"
    assert found["clone3"] == "ENOSYS"
    for call in ("add_key", "keyctl", "bpf", "perf_event_open", "kexec_load", "init_module"):
        assert found[call] == "EPERM", call
    assert found["userfaultfd"] == "EPERM"
    assert found["mount"] == "EPERM"
    assert found["ptrace_traceme"] == "EPERM"
    assert found["tiocsti"] == "EPERM"
    assert found["seccomp"] == "2" and found["no_new_privs"] == "1"
    assert found["cap_eff"] == "0000000000000000"
    assert found["fork"] == 7  # ordinary programs still run
    assert "unshare failed" in run(api, victim["id"], "unshare -Ur id")["stderr"]
    still_answering(api, victim["id"], neighbour["id"])


def test_desktop_programs_cannot_reach_into_the_guest_daemon(api, victim, neighbour):
    found = probe(api, victim["id"], "trace-guest")
    assert found["ptrace_attach"] == "EPERM"
    for what in ("mem", "environ", "fd", "maps"):
        assert found[what] == "EACCES", what
    assert found["pidfd_getfd"] == "EPERM"
    assert found["guest_sockets_visible"] == "[]"
    assert run(api, victim["id"], "ls /run/cubicle")["exit_code"] != 0
    still_answering(api, victim["id"], neighbour["id"])


def test_a_fake_guest_answers_nobody_and_files_download_as_bytes(api, victim, neighbour):
    """The issue's first probe: a server of the desktop's own where the guest's socket was
    (or anywhere it can write) never answers for the guest."""
    fakes = [f"{place}/guest.sock" for place in ("/run/user/1000", "/tmp", "/home/user")]
    started = run(
        api,
        victim["id"],
        f"python3 ~/.probe_inside.py fake-guest {' '.join(fakes)} > /tmp/fake.log 2>&1 &"
        " sleep 1; cat /tmp/fake.log",
    )
    assert "listening" in started["stdout"], started
    page = b"<html><script>alert(document.cookie)</script>the real file</html>"
    base = f"/api/desktops/{victim['id']}/files"
    assert api.put(base, params={"path": "~/evil.html"}, content=page).status_code == 200
    got = api.get(base, params={"path": "~/evil.html"})
    assert got.status_code == 200 and got.content == page  # the real guest answered
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"].startswith("attachment")
    assert got.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in got.headers["content-security-policy"]
    run(api, victim["id"], "pkill -f fake-guest; true")
    still_answering(api, victim["id"], neighbour["id"])


def test_a_fork_bomb_stops_at_max_pids(api, victim, neighbour):
    found = probe(api, victim["id"], "fork", "2000", timeout_s=60)
    assert found["failure"] == "EAGAIN", found
    assert found["forked"] < VICTIM["max_pids"]
    cgroup = cgroups.find(victim["id"])
    assert cgroup is not None and cgroup.stats().pids_refused > 0
    still_answering(api, victim["id"], neighbour["id"])


def test_memory_held_stays_within_memory_mb(api, victim, neighbour):
    """Three programs holding 400 MiB each, with 768 MiB for the whole desktop."""
    hold = "python3 ~/.probe_inside.py hold 400 20 > /dev/null 2>&1 &"
    run(api, victim["id"], f"{hold} {hold} {hold} sleep 8; echo done", timeout_s=30)
    cgroup = cgroups.find(victim["id"])
    assert cgroup is not None
    stats = cgroup.stats()
    assert stats.oom_kills >= 1
    assert stats.memory_bytes <= VICTIM["memory_mb"] * 1024 * 1024
    run(api, victim["id"], "pkill -f 'probe_inside.py hold'; true")
    still_answering(api, victim["id"], neighbour["id"])


def test_desktop_cgroups_sit_below_the_services_own(service, victim):
    cgroup = cgroups.find(victim["id"])
    assert cgroup is not None
    own = cgroups.own_cgroups(Path(f"/proc/{service.process.pid}/cgroup").read_text())
    for path in cgroup.paths:
        relative = path.relative_to(cgroups.ROOT)
        if cgroup.version == 1:
            controller = relative.parts[0]
            service_path = own[controller].strip("/")
            inside = "/".join(relative.parts[1:])
        else:
            service_path, inside = own[""].strip("/"), str(relative)
        assert inside.startswith(service_path), (inside, service_path)
        assert path.parent.name.startswith(("cubicle-", "desktops"))
        assert len(relative.parts) >= 2 + (cgroup.version == 1)  # never at a root


def test_a_full_disk_is_enospc_inside_and_bounded_on_the_host(service, api, victim, neighbour):
    image = service.data_dir / "desktops" / victim["id"] / "disk.img"
    before = os.stat(image).st_blocks * 512
    found = probe(api, victim["id"], "fill", "/home/user/big", "1024", timeout_s=120)
    assert found["failure"] == "ENOSPC" and found["written_mb"] < VICTIM["disk_mb"], found
    # /tmp, /var/tmp and the runtime directory share that disk: full too.
    for place in ("/tmp", "/var/tmp", "/run/user/1000"):
        more = probe(api, victim["id"], "fill", f"{place}/more", "64")
        assert more["failure"] == "ENOSPC" and more["written_mb"] <= 1, (place, more)
    upload = api.put(
        f"/api/desktops/{victim['id']}/files", params={"path": "~/up.bin"}, content=b"x" * 65536
    )
    assert upload.status_code == 507 and upload.json()["error"] == "disk_full", upload.text
    # The host's disk grew by no more than the desktop's disk.
    grown = os.stat(image).st_blocks * 512 - before
    assert grown <= VICTIM["disk_mb"] * 1024 * 1024
    # Everything else writable is small tmpfs, and / and /dev are read-only.
    shm = probe(api, victim["id"], "fill", "/dev/shm/big", "1024", timeout_s=60)
    assert shm["failure"] == "ENOSPC" and shm["written_mb"] <= VICTIM["memory_mb"] // 2
    run_tmpfs = probe(api, victim["id"], "fill", "/run/big", "64")
    assert run_tmpfs["failure"] == "ENOSPC" and run_tmpfs["written_mb"] <= 16
    for place in ("/big", "/dev/big", "/etc/big", "/usr/big"):
        assert probe(api, victim["id"], "fill", place, "1")["failure"] == "EROFS", place
    still_answering(api, victim["id"], neighbour["id"])
    run(api, victim["id"], "rm -f ~/big /tmp/more /var/tmp/more /run/user/1000/more")
    run(api, victim["id"], "rm -f /dev/shm/big /run/big")
    assert probe(api, victim["id"], "fill", "/home/user/again", "8")["failure"] is None


def test_requests_over_the_operators_maxima_are_refused(api):
    for body, setting in (
        ({"memory_mb": 65_536}, "DESKTOP_MAX_MEMORY_MB"),
        ({"max_pids": 65_536}, "DESKTOP_MAX_PIDS"),
        ({"disk_mb": 1_048_576}, "DESKTOP_MAX_DISK_MB"),
    ):
        refused = api.post("/api/desktops", json=body)
        assert refused.status_code == 422, refused.text
        assert setting in refused.json()["detail"]
    assert api.get("/healthz").status_code == 200


def test_a_desktop_that_ends_leaves_no_mount_cgroup_or_image(service, api):
    info = create(api, disk_mb=128)
    directory = service.data_dir / "desktops" / info["id"]
    assert (directory / "disk").is_mount()
    assert cgroups.find(info["id"]) is not None
    assert api.delete(f"/api/desktops/{info['id']}").status_code == 204
    deadline = time.monotonic() + 10
    while directory.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not directory.exists()
    assert cgroups.find(info["id"]) is None
    assert info["id"] not in Path("/proc/self/mountinfo").read_text()


def test_the_network_reaches_nothing_of_this_host(api):
    """`network: true` for whoever runs the service (no root needed): this host's own
    addresses and its loopback stay out of reach (test_network.py has the whole policy)."""
    own = sorted(str(a) for a in egress.host_addresses() if a.version == 4 and not a.is_loopback)
    listener = socket.create_server(("0.0.0.0", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    info = create(api, network=True)
    try:
        assert "tap0" in run(api, info["id"], "cat /proc/net/dev")["stdout"]
        targets = [f"{address}:{port}" for address in own] + [f"10.0.2.2:{port}"]
        found = probe(api, info["id"], "connect", *targets, timeout_s=60)
        assert all(verdict != "connected" for verdict in found.values()), found
        with pytest.raises(TimeoutError):
            listener.accept()
        still_answering(api, info["id"])
    finally:
        listener.close()
        api.delete(f"/api/desktops/{info['id']}")


def test_the_browser_runs_without_user_namespaces(api, neighbour):
    """Chromium's own sandbox needs user namespaces, which no desktop may create: the
    desktop's copy of /etc/chromium.d starts it without (the desktop is the sandbox)."""
    launched = api.post(f"/api/desktops/{neighbour['id']}/launch", json={"app": "browser"})
    assert launched.status_code == 200, launched.text

    def browsing() -> bool:
        found = run(api, neighbour["id"], "pgrep -c -x chromium || true")
        return int(found["stdout"].strip() or 0) >= 3

    wait_until(browsing, 30, interval_s=1, what="Chromium's processes")
    log = run(api, neighbour["id"], "cat /tmp/cubicle-apps.log")["stdout"]
    assert "No usable sandbox" not in log
    run(api, neighbour["id"], "pkill -f /usr/lib/chromium/chromium; true")
    still_answering(api, neighbour["id"])
