"""cgroup v2, for real: the runtime's cgroup code and a fork and a memory bomb, on a Debian
kernel booted under QEMU (TCG), as root in a unit of its own and as an ordinary user in a
delegated cgroup (`qemu_v2.py`, `v2_inside.py`; docs/security.md says how).

This machine's kernel offers cgroup v1 controllers only; every other test here runs on
those. Bounded: one boot, killed after 330 s (about 2 minutes on this 2-core machine).
"""

from __future__ import annotations

import json

import pytest

from tests.security import qemu_v2

pytestmark = pytest.mark.root_only  # one boot per run, in the root part


@pytest.mark.timeout(360)
def test_limits_hold_on_cgroup_v2_as_root_and_as_a_delegated_user(tmp_path):
    if missing := qemu_v2.missing():
        pytest.fail(f"the cgroup v2 test needs {', '.join(missing)}: run scripts/bootstrap.sh test")
    initramfs = tmp_path / "initramfs.cpio"
    qemu_v2.build_initramfs(initramfs)
    console = qemu_v2.boot(initramfs, timeout_s=330)
    results = {
        (found := json.loads(line.split(" ", 1)[1]))["label"]: found
        for line in console.splitlines()
        if line.startswith("V2RESULT ")
    }
    assert set(results) == {"root", "user"}, console[-3000:]
    for label, found in results.items():
        assert found["version"] == 2, found
        # Below the service's own cgroup, never at the root.
        service_dir = found["service_cgroup"].rsplit("/", 1)[0]
        assert found["desktop"].startswith(service_dir + "/desktops/"), found
        assert found["memory_max"] == str(64 * 1024 * 1024)
        assert found["pids_max"] == "32" and found["cpu_max"] == "50000 100000"
        assert found["parent_memory_max"] == str(256 * 1024 * 1024)  # the service-wide cap
        forked = int(found["fork_out"].split()[1])
        assert forked < 32 and found["pids_refused"] >= 1, (label, found)
        assert found["memory_exit"] == -9 and found["oom_kills"] >= 1, (label, found)
        assert found["frozen_still"] and found["thawed_moved"], (label, found)  # pause
        assert found["removed"], found  # killed while frozen, and gone
    assert results["user"]["uid"] == 1000
    assert "V2EXIT 0" in console
