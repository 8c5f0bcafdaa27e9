"""Package names that load on first use (PEP 562), for `desktop`, `streaming` and `agent`."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports each name from its home module on first use."""
    where = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__
