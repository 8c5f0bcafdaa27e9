"""A real Ray cluster on this machine: a head and worker nodes, each a raylet of its own.

`ray.cluster_utils.Cluster` starts the same processes `ray start` does (GCS, raylets, object
stores), so placement, resource accounting and failure detection are Ray's own. Object
stores and worker counts are kept small for a 2-core machine; the head offers no desktops.
Health checks run every second, as an operator who wants node failures noticed within
seconds configures them (`docs/cluster.md`). Each worker keeps its desktops in a data
directory of its own, as separate machines would; shutting down removes them, and what a
killed node left behind (its desktops' directories and cgroups) with them.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = 1024**3
DESKTOP_GIB = 2
"""What a desktop reserves of Ray's `memory` resource by default (CUBICLE_MEMORY_MB)."""
OBJECT_STORE_BYTES = 80 * 1024 * 1024
"""Ray's floor is 75 MiB; desktops put nothing in it."""
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
}


@dataclass
class LocalCluster:
    """A head node and worker nodes on this machine."""

    cluster: Any
    workers: list[Any] = field(default_factory=list)
    data_dirs: list[Path] = field(default_factory=list)
    """The worker nodes' CUBICLE_DATA_DIR, one each."""

    @property
    def address(self) -> str:
        """The head's GCS address, as `CUBICLE_RAY_ADDRESS` takes it."""
        return self.cluster.address

    def add_worker(self, desktops: int = 2, labels: dict[str, str] | None = None) -> Any:
        """A worker node that offers `desktops` desktops and the memory they reserve."""
        memory_gib = desktops * DESKTOP_GIB + 1
        data_dir = Path(tempfile.mkdtemp(prefix="cubicle-node-", dir="/var/tmp"))
        data_dir.chmod(0o711)  # the desktops' own users walk through it
        self.data_dirs.append(data_dir)
        node = self.cluster.add_node(
            env_vars={"CUBICLE_DATA_DIR": str(data_dir)},
            num_cpus=1,
            resources={"cubicle_desktop": desktops},
            memory=int(memory_gib * GiB),
            object_store_memory=OBJECT_STORE_BYTES,
            labels=labels or {},
        )
        self.workers.append(node)
        return node

    def kill_worker(self, node: Any) -> None:
        """Kill every Ray process of the node at once, as a machine that dies."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)


@contextlib.contextmanager
def local_cluster(workers: int = 2, desktops_each: int = 2) -> Iterator[LocalCluster]:
    """Start a head and `workers` worker nodes; shut everything down however it ends."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False,
            "_system_config": HEALTH_CHECKS,
        },
    )
    local = LocalCluster(cluster)
    try:
        for index in range(workers):  # labelled, for desktops that ask for a node
            local.add_worker(desktops_each, labels={"worker": str(index)})
        cluster.wait_for_nodes(timeout=60)
        yield local
    finally:
        cluster.shutdown()
        for data_dir in local.data_dirs:
            _clear(data_dir)


def _clear(data_dir: Path) -> None:
    """Remove a node's data directory, with the cgroups and disks of desktops a dead node
    left."""
    from cubicle.server.runtime import cgroups, disk

    for desktop in (data_dir / "desktops").glob("*"):
        if (found := cgroups.find(desktop.name)) is not None:
            found.kill_all()
    disk.sweep(data_dir / "desktops")
    shutil.rmtree(data_dir, ignore_errors=True)
