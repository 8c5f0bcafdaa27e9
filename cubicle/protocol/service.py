"""The service API's own models: desktops as the control plane creates and lists them."""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cubicle.protocol import actions as a
from cubicle.protocol.errors import InvalidRequest
from cubicle.protocol.models import Screen

DesktopStatus = Literal["starting", "ready", "paused", "failed", "stopped"]


NodeLabelKey = Annotated[str, Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?$")]
NodeLabelValue = Annotated[str, Field(min_length=1, max_length=256)] | bool | int


class NodeInfo(BaseModel):
    """The cluster node that holds a desktop."""

    id: str
    """The cluster's id of the node (Ray's node id)."""
    address: str
    """The node's IP address."""


NetworkName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")]
"""A private network's name or a desktop's alias: a DNS label (lowercase, digits, '-')."""


class CreateNetwork(BaseModel):
    """Body of `POST /api/networks`."""

    model_config = ConfigDict(extra="forbid")

    name: NetworkName


class NetworkMember(BaseModel):
    id: str
    """The desktop's id: also its name on the network."""
    alias: str | None = None
    address: str
    """Its IPv4 address on the network."""


class NetworkInfo(BaseModel):
    """A private network: a switch only its desktops are plugged into."""

    name: str
    subnet: str
    desktops: list[NetworkMember]
    created_at: datetime


_HOST_NAME = re.compile(
    r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
)


def _host_pattern(text: str) -> str:
    name = text.strip().lower().rstrip(".")
    if len(name) > 253 or not _HOST_NAME.match(name):
        raise ValueError(
            f"{text!r} is not a host name: give names as api.example.com, or *.example.com "
            "for every name under it"
        )
    return name


def _host_name(text: str) -> str:
    name = _host_pattern(text)
    if name.startswith("*."):
        raise ValueError(f"{text!r}: a host name here is one name, without '*'")
    return name


def _ip_address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None


def _destination(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        pass
    try:
        return _host_pattern(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a CIDR (203.0.113.7/32, 198.51.100.0/24) nor a host name "
            "(api.example.com, *.example.com)"
        ) from None


def is_cidr(destination: str) -> bool:
    """Whether a validated egress destination is a CIDR (else it is a host name)."""
    return "/" in destination


Destination = Annotated[str, AfterValidator(_destination)]
"""A CIDR or a host name (`*.example.com`: every name under example.com)."""
HostPattern = Annotated[str, AfterValidator(_host_pattern)]
"""A host name, or `*.example.com` for every name under example.com."""
HostName = Annotated[str, AfterValidator(_host_name)]
IpAddress = Annotated[str, AfterValidator(_ip_address)]


class DesktopEgress(BaseModel):
    """A desktop's own egress rules, within the operator's policy: they narrow it, never
    widen it (`PUT /api/desktops/{id}/network`)."""

    model_config = ConfigDict(extra="forbid")

    allow: Annotated[list[Destination], Field(max_length=64)] = []
    """When not empty, the only destinations the desktop may reach (its DNS stays): CIDRs,
    and host names, which connections to ports 80 and 443 are judged by (TLS SNI, HTTP
    Host) through the egress proxy."""
    deny: Annotated[list[Destination], Field(max_length=64)] = []
    """Destinations the desktop may not reach, whatever `allow` says."""

    def names(self) -> bool:
        """Whether some rule is a host name (the egress proxy judges those)."""
        return any(not is_cidr(rule) for rule in (*self.allow, *self.deny))


SecretName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
PLACEHOLDER_PREFIX = "cubicle-secret:"
"""What a desktop sees in place of a secret: `cubicle-secret:<name>`."""


def placeholder(name: str) -> str:
    return f"{PLACEHOLDER_PREFIX}{name}"


def _format(text: str) -> str:
    if text.count("{value}") != 1 or "\r" in text or "\n" in text:
        raise ValueError('the format holds "{value}" once, on one line: "Bearer {value}"')
    return text


class CreateSecret(BaseModel):
    """Body of `POST /api/secrets`: a value desktops use without ever holding it."""

    model_config = ConfigDict(extra="forbid")

    name: SecretName
    value: Annotated[str, Field(min_length=1, max_length=8192, pattern=r"^[^\r\n\x00]*$")]
    """Kept encrypted; never returned by the API, never inside a desktop."""
    hosts: Annotated[list[HostPattern], Field(min_length=1, max_length=32)]
    """The only hosts it is sent to (`*.example.com`: every name under example.com)."""
    header: Annotated[str, Field(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")] = "Authorization"
    """The request header the egress proxy sets when a request to one of `hosts` lacks it."""
    format: Annotated[str, AfterValidator(_format), Field(max_length=256)] = "Bearer {value}"
    """That header's value, `{value}` standing for the secret."""
    env: EnvName | None = None
    """The variable desktops see the placeholder in; the name in capitals when absent."""


class SecretInfo(BaseModel):
    """A secret as the API shows it: everything but its value."""

    name: str
    hosts: list[str]
    header: str
    format: str
    env: str
    placeholder: str
    """What desktops see instead of the value, in `env`; the egress proxy puts the value
    in its place in requests to `hosts`, and refuses requests carrying it elsewhere."""
    created_at: datetime


class EgressRefusal(BaseModel):
    """A connection or request the egress proxy refused."""

    at: datetime
    host: str
    """The name it asked for (TLS SNI, HTTP Host), else the address."""
    port: int
    reason: str


class DesktopNetwork(BaseModel):
    """`GET /api/desktops/{id}/network`: a desktop's egress rules, secrets and refusals."""

    egress: DesktopEgress | None = None
    secrets: list[str] = []
    refused: list[EgressRefusal] = []
    """The egress proxy's latest refusals, newest last (at most 100)."""


VOLUME_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
VolumeName = Annotated[str, Field(pattern=VOLUME_NAME_PATTERN)]


def _volume_path(path: str) -> str:
    parts = path.split("/")[1:]
    if not path.startswith(("/home/user/", "/mnt/")) or any(p in ("", ".", "..") for p in parts):
        raise ValueError("a volume mounts at a path below /home/user/ or /mnt/, like /mnt/data")
    return path


VolumePath = Annotated[
    str,
    Field(min_length=6, max_length=200, pattern=r"^/[A-Za-z0-9._/-]+$"),
    AfterValidator(_volume_path),
]


class VolumeMount(BaseModel):
    """A volume in a desktop, written by it (one writer at a time) or read only (many)."""

    model_config = ConfigDict(extra="forbid")

    volume: VolumeName
    read_only: bool = False


class CreateVolume(BaseModel):
    """`POST /api/volumes`."""

    model_config = ConfigDict(extra="forbid")

    name: VolumeName
    size_mb: Annotated[int, Field(ge=16, le=65_536)] = 1024
    """Its quota: writes past it fail with ENOSPC inside; the host's disk grows at most so."""


class VolumeInfo(BaseModel):
    name: str
    size_mb: int
    used_bytes: int
    """What it takes on the host's disk now."""
    created_at: datetime
    mounted_in: dict[str, Literal["read-write", "read-only"]] = {}
    """The desktops it is in now, and how."""


class Lifecycle(BaseModel):
    """What happens to a desktop at its idle timeout, and how long it may live."""

    model_config = ConfigDict(extra="forbid")

    on_timeout: Literal["kill", "pause"] = "kill"
    """At its idle timeout: stop it (everything in it is lost), or pause it, to be
    resumed later (`POST …/resume`, or by any call with `auto_resume`)."""
    keep_memory: bool = True
    """How `on_timeout: pause` pauses it: with its memory, or its disk only."""
    auto_resume: bool = False
    """A paused desktop resumes by itself when something uses it: an API call that reaches
    inside (screenshot, actions, exec, files, code…), its ports, or a new viewer."""
    max_lifetime_s: Annotated[int, Field(ge=10, le=30 * 86_400)] | None = None
    """Stop it this many seconds after its creation, running or paused, whatever else."""


class CreateDesktop(BaseModel):
    """Body of `POST /api/desktops`. Every field has a default."""

    model_config = ConfigDict(extra="forbid")

    resolution: tuple[
        Annotated[int, Field(ge=320, le=7680)], Annotated[int, Field(ge=240, le=4320)]
    ] = (
        1280,
        800,
    )
    """Screen width and height in pixels."""
    timeout_s: Annotated[int, Field(ge=10, le=86_400)] = 600
    """Seconds without an API call after which the desktop is stopped."""
    network: bool = False
    """Give the desktop a user-mode network (slirp4netns). Off: loopback only."""
    memory_mb: Annotated[int, Field(ge=256, le=65_536)] | None = None
    """Memory limit in MiB; the service default when absent."""
    max_pids: Annotated[int, Field(ge=64, le=65_536)] | None = None
    """Most processes and threads the desktop may run; the service default when absent."""
    disk_mb: Annotated[int, Field(ge=64, le=1_048_576)] | None = None
    """Disk the desktop may fill (home, /tmp, uploads), MiB; the service default when absent."""
    runtime: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    """The runtime to start it in (`local`, …); the service's default when absent."""
    node: (
        Annotated[dict[NodeLabelKey, NodeLabelValue], Field(min_length=1, max_length=16)] | None
    ) = None
    """Labels the node that holds the desktop must carry, e.g. `{"gpu": true}` (runtimes
    that place desktops on a cluster, `ray`: they become Ray label selectors, values in
    lower-case text)."""

    def node_labels(self) -> tuple[tuple[str, str], ...]:
        """The `node` labels as text, sorted."""
        text = {
            k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in (self.node or {}).items()
        }
        return tuple(sorted(text.items()))

    snapshot: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    """Start from this snapshot (`POST /api/desktops/{id}/snapshot`), in the runtime that
    made it."""
    networks: Annotated[list[NetworkName], Field(max_length=8)] = []
    """Private networks to join (`POST /api/networks`): the desktops on one reach each
    other by id or alias, on every port, and nothing else through it (local runtime)."""
    alias: NetworkName | None = None
    """Another name the desktop answers to on its networks."""
    egress: DesktopEgress | None = None
    """Its own egress rules (needs `network`; changeable while it runs)."""
    secrets: Annotated[list[SecretName], Field(max_length=16)] = []
    """Secrets (`POST /api/secrets`) its programs use through the egress proxy: each
    desktop sees only a placeholder (needs `network`; local runtime)."""
    hosts: Annotated[dict[HostName, IpAddress], Field(max_length=64)] = {}
    """Extra lines of its /etc/hosts, `{"api.internal": "10.1.2.3"}`; the egress proxy
    resolves these names the same way."""
    lifecycle: Lifecycle = Lifecycle()
    """Pause instead of stopping at the idle timeout, resume on use, a longest life."""
    volumes: Annotated[dict[VolumePath, VolumeName | VolumeMount], Field(max_length=8)] = {}
    """Volumes (`POST /api/volumes`) to mount, by path inside: `{"/mnt/data": "team-data"}`
    read-write, or `{"/mnt/data": {"volume": "team-data", "read_only": true}}` (local
    runtime)."""

    def volume_mounts(self) -> list[tuple[str, VolumeMount]]:
        return [
            (path, VolumeMount(volume=v) if isinstance(v, str) else v)
            for path, v in sorted(self.volumes.items())
        ]


class PauseDesktop(BaseModel):
    """`POST /api/desktops/{id}/pause`."""

    model_config = ConfigDict(extra="forbid")

    keep_memory: bool = True
    """Keep the desktop's processes and memory, frozen where they stand (resume picks up
    exactly there); False: its programs end and only its disk is kept (it holds no memory
    while paused, and boots again on resume; local runtime)."""


class UsageSample(BaseModel):
    """One reading of what a desktop uses, taken by the service every few seconds."""

    at: datetime
    cpu_pct: float | None = None
    """CPU its processes used since the reading before, in percent of one core (200 is two
    cores busy); None for the first reading, or where the host does not count it."""
    memory_bytes: int
    """Memory charged to it, page cache included."""
    memory_cache_bytes: int = 0
    """The page cache part of it."""
    disk_bytes: int | None = None
    """What its own disk takes on the host."""
    net_rx_bytes: int | None = None
    """Bytes received since it started; None without a network."""
    net_tx_bytes: int | None = None


class DesktopMetrics(BaseModel):
    """`GET /api/desktops/{id}/metrics`: its readings, oldest first, and its limits."""

    desktop_id: str
    interval_s: float
    """Seconds between readings."""
    memory_limit_bytes: int
    disk_limit_bytes: int
    cpu_cores: float | None = None
    """Its CPU cap in cores; None when it has none."""
    samples: list[UsageSample]


class DesktopInfo(BaseModel):
    id: str
    status: DesktopStatus
    screen: Screen
    network: bool
    created_at: datetime
    timeout_s: int
    """Idle seconds before the desktop is stopped."""
    expires_at: datetime | None = None
    """When the desktop stops if nothing touches it (a paused one waits until resumed)."""
    paused_at: datetime | None = None
    """When it was paused, while it is."""
    paused_memory: bool | None = None
    """While paused: whether its memory was kept (programs frozen where they stood), or
    only its disk (it boots again on resume)."""
    lifecycle: Lifecycle = Lifecycle()
    """What its idle timeout does, whether it resumes on use, its longest life."""
    usage: UsageSample | None = None
    """Its latest reading (`GET …/metrics` has the series)."""
    reason: str | None = None
    """Why the desktop failed or stopped."""
    degraded: str | None = None
    """What last went wrong inside the running desktop and what was done about it (e.g.
    `xfwm4 exited with status -9: started it again`); None while nothing did."""
    startup_ms: float | None = None
    """Milliseconds the desktop took from start to drawn."""
    from_pool: bool = False
    """Taken ready from the warm pool: the create call did not wait for `startup_ms`."""
    runtime: str = "local"
    """The runtime the desktop runs in."""
    node: NodeInfo | None = None
    """The cluster node that holds it; absent for desktops on the service's own host."""
    networks: list[str] = []
    """The private networks it is on."""
    egress: DesktopEgress | None = None
    """Its own egress rules, when it has some."""
    domain: str | None = None
    """Where its ports are reached through the service: port P of the desktop answers at
    `<P>-<id>.<domain>` (E2B's `get_host`), over HTTP or HTTPS."""


class PoolKind(BaseModel):
    """The spares of one kind of desktop."""

    resolution: tuple[int, int]
    network: bool
    runtime: str
    target: int
    """Spares the pool keeps of this kind."""
    ready: int
    """Drawn, handed out at once."""
    booting: int


class PoolInfo(BaseModel):
    """`GET /api/pool`: the warm pool's spare desktops and who asked for them."""

    enabled: bool
    """False with `CUBICLE_WARM_POOL=0`: every create boots a desktop."""
    target: int
    ready: int
    booting: int
    wanted: dict[str, int]
    """Spares asked for by the service's parts (`board`: the task board's concurrency), on
    top of `CUBICLE_WARM_POOL` for API users."""
    held_back: str | None = None
    """Why the pool does not boot the spares it misses, when something stops it (memory,
    `CUBICLE_MAX_DESKTOPS`)."""
    kinds: list[PoolKind]


class SetTimeout(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_s: Annotated[int, Field(ge=10, le=86_400)]


# --- live view: recordings and share links ----------------------------------------------

ActionSource = Literal["api", "viewer"]
RecordingStatus = Literal["recording", "finished", "failed", "interrupted"]
"""`interrupted`: the service stopped while recording; the video holds what was written."""


class ActionEntry(BaseModel):
    offset_ms: float
    """Milliseconds from the start of the video to the action (0 if it came first)."""
    source: ActionSource
    """`api`: a REST call; `viewer`: a person controlling from the browser."""
    action: a.Action


class RecordingInfo(BaseModel):
    id: str
    desktop_id: str
    status: RecordingStatus
    started_at: datetime
    stopped_at: datetime | None = None
    duration_ms: float | None = None
    """Milliseconds of video; None until the first frame arrived."""
    frames: int = 0
    bytes: int = 0
    """Size of the MP4 file."""
    width: int | None = None
    """Pixels."""
    height: int | None = None
    """Pixels."""
    reason: str | None = None
    """Why a recording failed."""
    overlay: bool = False
    """The actions are drawn into the video (click ripples, drag paths, scroll marks,
    captions of typed text and keys)."""


class ActionLog(BaseModel):
    recording: RecordingInfo
    actions: list[ActionEntry]


AccessMode = Literal["view", "control"]


class ShareLink(BaseModel):
    """A link to one desktop's live view, as `POST /api/desktops/{id}/share` makes it."""

    id: str
    """Names the link to revoke it (`DELETE /api/desktops/{id}/shares/{link_id}`)."""
    desktop_id: str
    mode: AccessMode
    """`view` watches only; `control` may also take control."""
    token: str | None = None
    """Only in the answer that made the link: the service keeps a hash of it, not it."""
    url: str
    """The viewer page (with the token in it, in the answer that made the link)."""
    expires_at: datetime
    created_at: datetime


Port = Annotated[int, Field(ge=1, le=65535)]


class PortInfo(BaseModel):
    """A TCP port a program listens on inside a desktop (`GET /api/desktops/{id}/ports`)."""

    port: int
    address: str
    """The address it is bound to inside (any of them is reached through the service)."""
    process: str | None = None
    pid: int | None = None
    public: bool = False
    """Open to anyone who knows its address, without a token (`PUT .../ports/{port}`)."""
    host: str
    """Its address through the service: `<port>-<desktop id>.<domain>` (E2B's `get_host`)."""


class PortAccess(BaseModel):
    """Body of `PUT /api/desktops/{id}/ports/{port}`: who may reach the port."""

    model_config = ConfigDict(extra="forbid")

    public: bool
    """True: anyone who can reach the service may open it, without a token."""


class PreviewRequest(BaseModel):
    """Body of `POST /api/desktops/{id}/ports/{port}/previews`."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] = 3600
    """Seconds the link works (up to 7 days)."""


class PreviewLink(BaseModel):
    """A link that opens one port of one desktop through the service, until it expires or
    is revoked (`DELETE /api/desktops/{id}/previews/{link_id}`)."""

    id: str
    desktop_id: str
    port: int
    token: str | None = None
    """Only in the answer that made the link: sent as `X-Access-Token`, or carried by `url`."""
    url: str | None = None
    """Opens the port in a browser (TLS from the service's CA; the page sets a cookie for
    that one host and drops the token from its address)."""
    expires_at: datetime
    created_at: datetime


class CdpEndpoint(BaseModel):
    """The desktop's Chromium with DevTools on, through the service (`POST .../browser/cdp`)."""

    url: str
    """A WebSocket URL for `playwright.chromium.connect_over_cdp(url)`: it carries a preview
    token for the DevTools port, valid `expires_at`."""
    expires_at: datetime
    port: int
    """The DevTools port inside the desktop (reachable only through the service)."""


SNAPSHOT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
SNAPSHOT_NAME = re.compile(SNAPSHOT_NAME_PATTERN)
"""A snapshot's name: 1-64 letters, digits, '.', '_' or '-', not starting with either."""


def snapshot_name(name: str) -> str:
    """`name`, if it is a snapshot's name (`SNAPSHOT_NAME`); `InvalidRequest` otherwise."""
    if not SNAPSHOT_NAME.match(name):
        raise InvalidRequest(f"snapshot name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


class TakeSnapshot(BaseModel):
    """Body of `POST /api/desktops/{id}/snapshot`."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=SNAPSHOT_NAME_PATTERN)]
    """What to call it: 1-64 letters, digits, '.', '_' or '-'."""


class SnapshotInfo(BaseModel):
    name: str
    parent: str
    """The desktop it was taken of."""
    runtime: str = "microvm"
    """The runtime its desktops start in: `local` (the disk) or `microvm` (disk and memory)."""
    created_at: datetime | None = None
    size_bytes: int | None = None
    """What it takes on the host's disk."""
    memory: bool = True
    """Whether desktops started from it come back with its memory (running programs)."""


class ForkDesktop(BaseModel):
    """`POST /api/desktops/{id}/fork`."""

    model_config = ConfigDict(extra="forbid")

    count: Annotated[int, Field(ge=1, le=16)] = 1


class ForkError(BaseModel):
    index: int
    """Which child (0-based) could not be made."""
    error: str
    detail: str


class Forked(BaseModel):
    """The children of a fork, and the ones that could not be made."""

    desktops: list[DesktopInfo]
    errors: list[ForkError] = []
    snapshot: str | None = None
    """The snapshot the children started from, when it must be kept for them (microvm:
    their disks and memory build on it); delete it once they are gone. None: removed."""
