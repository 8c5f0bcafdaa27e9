"""Service settings: environment variables `CUBICLE_*`, with defaults that work out of the box."""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cubicle.protocol.data_dir import default_data_dir

LOCAL_DOMAIN = "cubicle.localhost"
"""The default domain of desktops' ports: browsers resolve every `*.localhost` to loopback."""

CidrList = Annotated[tuple[str, ...], NoDecode]
"""Comma-separated CIDRs in the environment (`10.0.0.5/32,192.168.1.0/24`)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CUBICLE_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    """Where the token, the database and the desktops' homes live."""
    images_dir: Path | None = None
    """Where the microvm runtime keeps its images and templates; `data_dir/images` if unset."""
    microvm_hang_s: Annotated[float, Field(gt=0)] = 60.0
    """Seconds a microVM may leave the host's pings unanswered before it counts as hung."""
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    """API token; generated on first start and kept in `data_dir/token` when unset."""
    domain: str | None = None
    """Where desktops' ports answer by host name: port P of desktop D is `P-D.<domain>`.
    Unset: `cubicle.localhost:<port>` (browsers resolve `*.localhost` to this machine).
    Behind a proxy or DNS of your own, e.g. `cubicle.example.com` or `example.com:8443`."""
    runtime: str = "local"
    """The runtime new desktops start in unless they ask for another (`cubicle.server.runtime`)."""
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
    max_body_mb: Annotated[int, Field(ge=1, le=1024)] = 4
    """Largest body of any other request (JSON), MiB; the task batch allows 32."""
    desktop_max_memory_mb: Annotated[int, Field(ge=256)] = 16_384
    """Most memory one create request may ask for, MiB."""
    desktop_max_pids: Annotated[int, Field(ge=64)] = 8192
    """Most processes one create request may ask for."""
    desktop_max_disk_mb: Annotated[int, Field(ge=64)] = 65_536
    """Most disk one create request may ask for, MiB."""
    total_memory_mb: Annotated[int, Field(ge=256)] | None = None
    """Memory all desktops together may use (the kernel enforces it); unset: 90 % of RAM."""
    total_pids: Annotated[int, Field(ge=64)] = 32_768
    """Processes all desktops together may run (the kernel enforces it)."""
    egress_allow: CidrList = ()
    """Networks desktops with `network: true` may reach although the policy blocks them."""
    egress_deny: CidrList = ()
    """Networks desktops may never reach, over everything else."""
    egress_ca_file: Path | None = None
    """CAs (PEM) the egress proxy trusts besides the system's when it verifies the servers
    desktops with secrets reach (a company's own CA)."""
    secrets_key: str | None = None
    """The key secrets are encrypted with (32 bytes, base64); absent, one made once in
    `<data dir>/secrets/key`."""
    unsafe_no_limits: bool = False
    """Start desktops even where this host cannot enforce their limits (a loud warning)."""
    unsafe_no_hardening: bool = False
    """No seccomp, cgroups or disk caps at all: only to measure what the hardening costs."""

    @field_validator("egress_allow", "egress_deny", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("egress_allow", "egress_deny")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            ipaddress.ip_network(text, strict=False)  # ValueError names the bad one
        return value

    start_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Seconds a desktop may take to come up before it counts as failed."""
    reap_interval_s: Annotated[float, Field(gt=0)] = 1.0
    """How often idle desktops are looked for, seconds."""
    metrics_interval_s: Annotated[float, Field(ge=0.2)] = 5.0
    """Seconds between two readings of each desktop's CPU, memory, disk and network use."""
    paused_retention_s: Annotated[int, Field(ge=10)] = 86_400
    """How long a paused desktop is kept (it holds its memory) before it is stopped."""
    ray_address: str | None = None
    """The Ray cluster of the `ray` runtime: the head's `HOST:PORT`, or `auto` for the
    cluster `ray start` made on this host (`docs/cluster.md`)."""
    ray_namespace: str = "cubicle"
    """The Ray namespace of the desktops' actors: services sharing it find each other's."""
    ray_placement: Literal["spread", "pack"] = "spread"
    """`spread`: desktops go to the least loaded nodes; `pack`: Ray fills nodes first."""
    ray_resource: str = "cubicle_desktop"
    """The Ray resource a node offers per desktop it can hold (`ray start --resources`)."""
    ray_node_runtime: str = "local"
    """The runtime that starts a desktop on the node Ray picked."""
    ray_spares: Annotated[int, Field(ge=0, le=16)] = 1
    """Actors of the `ray` runtime kept placed, their processes started, ahead of creates
    of default desktops (each holds one desktop's resources until a create takes it)."""

    @property
    def port_domain(self) -> str:
        """`domain`, or `cubicle.localhost:<port>`: what follows `<port>-<id>.`."""
        return self.domain or f"{LOCAL_DOMAIN}:{self.port}"

    @property
    def port_domain_name(self) -> str:
        """`port_domain` without its port: the name the service's certificate covers."""
        name, sep, port = self.port_domain.rpartition(":")
        return name if sep and port.isdigit() else self.port_domain

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 1024 * 1024

    @property
    def max_body_bytes(self) -> int:
        return self.max_body_mb * 1024 * 1024

    def desktops_memory_mb(self) -> int:
        """`total_memory_mb`, or 90 % of this machine's memory."""
        if self.total_memory_mb is not None:
            return self.total_memory_mb
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(pages * 0.9) // (1024 * 1024)


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once; tests and the CLI build their own `Settings`."""
    return Settings()
