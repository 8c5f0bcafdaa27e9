"""Desktop disks (`desktop.runtime.disk`): the empty template is made once, whoever asks."""

from __future__ import annotations

import threading
from pathlib import Path

from desktop.runtime import disk

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
