"""A fresh virtualenv with `pip install cubicle` and no extras, as a user's first install.

Built from a copy of the package's own files (pyproject, README, `cubicle/`), so the
checkout gets no build directory, with nothing of this interpreter's site-packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def make_bare_venv(where: Path) -> tuple[Path, int]:
    """A venv at `where/venv` with the bare package installed: its python, and how many bytes
    the install added to its site-packages (pip and setuptools not counted)."""
    source = where / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(
        REPO / "cubicle", source / "cubicle", ignore=shutil.ignore_patterns("__pycache__")
    )
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    before = tree_bytes(site_packages(venv))
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, str(source)], check=True, timeout=600)
    return venv / "bin" / "python", tree_bytes(site_packages(venv)) - before
