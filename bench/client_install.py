"""`client_install`: what `pip install cubicle` (no extras) weighs and how fast it imports.

Ours: a fresh venv with the bare package (`bench._bare`), its site-packages growth in MiB,
and the wall time of `python -c "from cubicle import Desktop"` in it, less the interpreter's
own start (`python -c pass` in the same venv), medians of interleaved runs.

Baseline, side by side: the full install every product module needs (this checkout's
`.venv`, `scripts/bootstrap.sh`'s extras), its site-packages size and the same import there,
and the import of the service's app (`cubicle.server.app`), what the one package used to
cost before the extras (every dependency was then installed by `pip install cubicle`).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._bare import make_bare_venv, site_packages, tree_bytes
from bench._run import Options, Target, progress

TARGET_BARE_MIB = 30.0
_CLIENT = "from cubicle import Desktop; Desktop.create"
_SERVER = "import cubicle.server.app"


@dataclass(frozen=True)
class ClientInstall:
    bare_mib: float
    """Site-packages growth of `pip install cubicle`, MiB."""
    full_mib: float
    """Site-packages of the full install (every extra), MiB."""
    bare_import_ms: float
    """Median wall time of importing the SDK in the bare venv, interpreter start excluded."""
    full_import_ms: float
    """The same import in the full install."""
    server_import_ms: float
    """Importing the service's app in the full install, interpreter start excluded."""
    runs: int
    targets: list[Target]


def _median_ms(python: Path, code: str, runs: int) -> float:
    """Median wall time of `python -c code` less that of `python -c pass`, interleaved."""
    spent: list[float] = []
    empty: list[float] = []
    for _ in range(runs):
        for target, snippet in ((spent, code), (empty, "pass")):
            started = time.perf_counter()
            subprocess.run([str(python), "-c", snippet], check=True)
            target.append(time.perf_counter() - started)
    return round((statistics.median(spent) - statistics.median(empty)) * 1000, 1)


def run(options: Options) -> ClientInstall:
    runs = 5 if options.quick else 15
    full = Path(sys.executable)
    with tempfile.TemporaryDirectory(prefix="cubicle-bare-") as where:
        progress("client_install: a fresh venv with `pip install cubicle`")
        bare, added = make_bare_venv(Path(where))
        progress(f"client_install: {runs} interleaved imports of each")
        bare_ms = _median_ms(bare, _CLIENT, runs)
        full_ms = _median_ms(full, _CLIENT, runs)
        server_ms = _median_ms(full, _SERVER, runs)
    mib = 1024 * 1024
    bare_mib = round(added / mib, 1)
    full_venv = Path(sys.prefix)
    full_mib = round(tree_bytes(site_packages(full_venv)) / mib, 1)
    return ClientInstall(
        bare_mib=bare_mib,
        full_mib=full_mib,
        bare_import_ms=bare_ms,
        full_import_ms=full_ms,
        server_import_ms=server_ms,
        runs=runs,
        targets=[
            Target(f"bare install under {TARGET_BARE_MIB:.0f} MiB", bare_mib < TARGET_BARE_MIB),
            Target(
                "`from cubicle import Desktop` no slower in the bare install than the full one",
                bare_ms <= full_ms,
            ),
        ],
    )
