"""What E2B's answers need to know of a sandbox beyond its Cubicle desktop."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

ENVD_PORT = 49983
CODE_INTERPRETER_PORT = 49999
ENVD_VERSION = "0.5.7"
"""The envd version Cubicle answers as: the SDKs turn features on by it (its SDKs:
≥0.3.0 `stdin=False`, ≥0.4.0 the default user decided here, ≥0.5.2 close_stdin, ≥0.5.7
octet-stream uploads). File metadata (0.6.2) and watch entry info (0.6.3) are not served."""
CLIENT_ID = "cubicle"
TEMPLATES = ("base", "desktop", "code-interpreter-v1")
"""Template names that start Cubicle's built-in desktop (custom templates: not yet)."""


@dataclass
class Sandbox:
    """What E2B's answers need beyond the desktop itself."""

    sandbox_id: str
    template: str
    access_token: str
    started_at: datetime
    end_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
