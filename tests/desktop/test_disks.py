"""Desktop disks (`cubicle.server.runtime.disk`): the empty template is made once, whoever asks;
runtimes sharing a directory leave each other's disks mounted."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from cubicle.server.runtime import disk

HOME = Path(__file__).resolve().parents[2] / "images" / "home"


def test_desktops_starting_at_once_make_one_template(tmp_path: Path):
    # Two ray desktops created together on one node once raced here: one renamed the
    # half-made template away under the other ("No such file or directory").
    disks = disk.Disks(tmp_path / "disks", HOME, spares_in=tmp_path, spare_mb=None)
    made, failed = [], []

    def start() -> None:
        try:
            made.append(disks._template(64))
        except Exception as exc:  # what a desktop's create would have failed with
            failed.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failed == []
    assert len(set(made)) == 1 and made[0].stat().st_size == 64 << 20
    assert sorted(p.name for p in (tmp_path / "disks").iterdir()) == ["template-64.img"]


def test_a_runtime_joining_a_shared_directory_leaves_its_neighbours_disks_mounted(
    tmp_path: Path,
):
    # Every desktop actor on a Ray node is a process with a runtime of its own, all keeping
    # desktops in the node's directory. Each used to unmount everything there on start,
    # and a neighbour's starting sandbox found its disk gone ("Can't find source path
    # .../disk/tmp: Permission denied").
    desktops = tmp_path / "desktops"
    desktops.mkdir()
    disks = disk.Disks(tmp_path / "disks", HOME, spares_in=desktops, spare_mb=None)
    first = disk.join(desktops)
    mounted = asyncio.run(disks.create(desktops / "a", 64, None))
    try:
        (mounted.path("tmp") / "note").write_text("still here")
        second = disk.join(desktops)  # a neighbour starts on the node
        assert mounted.mountpoint.is_mount()
        assert (mounted.path("tmp") / "note").read_text() == "still here"

        # Once no runtime is left, the next one to come unmounts what they left.
        os.close(first)
        os.close(second)
        third = disk.join(desktops)
        os.close(third)
        assert not mounted.mountpoint.is_mount()
    finally:
        mounted.release()
