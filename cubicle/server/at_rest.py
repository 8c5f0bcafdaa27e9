"""Files at rest: everything the service keeps is readable by its own user only.

The database (and its WAL), the token, settings, recordings and runs are created 0600 in
0700 directories (a process-wide umask of 077), and files older versions left more open
are closed at start. As root, the data directory itself stays traversable (0711) so that
each desktop's user can reach its own directory, and nothing else, by path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

RUNTIME_OWNED = ("desktops", "disks", "sandbox-etc", "volumes")
"""Directories the runtime lays out itself (each desktop's user must enter its own, and
read the /etc files every desktop shares: nothing secret), and the volumes (their users
enter their mounts; the images and records in it are the service's alone, 0600)."""


def protect(data_dir: Path) -> None:
    """Make the service's files owner-only, now and for whatever it creates from now on."""
    os.umask(0o077)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o711 if os.geteuid() == 0 else 0o700)
    for entry in data_dir.iterdir():
        if entry.name in RUNTIME_OWNED:
            continue
        _close(entry)
        if entry.is_dir() and not entry.is_symlink():
            for root, dirs, files in os.walk(entry):
                for name in dirs + files:
                    _close(Path(root, name))


def _close(path: Path) -> None:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        return  # not the service's own (a launcher's log, say): not its to change
    wanted = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
    if stat.S_IMODE(info.st_mode) & ~wanted:
        path.chmod(stat.S_IMODE(info.st_mode) & wanted)
