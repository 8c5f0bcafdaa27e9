"""Where a service keeps its token and desktops by default: both the service and the SDK
(which reads the local token file) need to agree on it, without the SDK loading the
service's settings."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """`CUBICLE_DATA_DIR` if set, else /var/lib/cubicle as root, else the XDG data home."""
    if configured := os.environ.get("CUBICLE_DATA_DIR"):
        return Path(configured)
    # As root the sandboxes run as other users, who must be able to walk into their own
    # directories: /root is closed to them, /var/lib is not.
    if os.geteuid() == 0:
        return Path("/var/lib/cubicle")
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "cubicle"
