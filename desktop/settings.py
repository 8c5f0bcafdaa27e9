"""Service settings: environment variables `CUBICLE_*`, with defaults that work out of the box."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    # As root the sandboxes run as other users, who must be able to walk into their own
    # directories: /root is closed to them, /var/lib is not.
    if os.geteuid() == 0:
        return Path("/var/lib/cubicle")
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "cubicle"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CUBICLE_", extra="ignore")

    data_dir: Path = Field(default_factory=_default_data_dir)
    """Where the token, the database and the desktops' homes live."""
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    """API token; generated on first start and kept in `data_dir/token` when unset."""
    runtime: str = "local"
    """The runtime new desktops start in unless they ask for another (`desktop.runtime`)."""
    max_desktops: Annotated[int, Field(ge=1, le=1000)] = 32
    warm_pool: Annotated[int, Field(ge=0, le=16)] = 1
    """Desktops of the default kind kept started and drawn for API users, handed out at
    once on create, besides those the board asks for (its concurrency); 0 turns the pool
    off."""
    warm_pool_reserve_mb: Annotated[int, Field(ge=0)] = 2048
    """The pool boots no spare while the host has less memory available than this, MiB."""
    warm_pool_nice: Annotated[int, Field(ge=0, le=19)] = 19
    """CPU niceness spares boot at: 19 gives them only CPU no desktop wants (on a host kept
    busy they wait; one taken is raised at once), 0 boots them like any desktop."""
    memory_mb: Annotated[int, Field(ge=256)] = 2048
    """Default memory limit of a desktop, MiB."""
    max_pids: Annotated[int, Field(ge=64)] = 1024
    """Default process and thread limit of a desktop."""
    disk_mb: Annotated[int, Field(ge=64)] = 4096
    """Default disk of a desktop (home, /tmp, uploads together), MiB."""
    cpu_cores: Annotated[float, Field(gt=0)] | None = None
    """CPU time one desktop may use, in cores; unset, desktops share the CPU by equal weight."""
    max_upload_mb: Annotated[int, Field(ge=1)] = 100
    """Largest file accepted by the files API, MiB."""
    start_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Seconds a desktop may take to come up before it counts as failed."""
    reap_interval_s: Annotated[float, Field(gt=0)] = 1.0
    """How often idle desktops are looked for, seconds."""

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 1024 * 1024


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once; tests and the CLI build their own `Settings`."""
    return Settings()
