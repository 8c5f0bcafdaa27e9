"""SQLite files of the service's rooms (the board, evaluation runs): how each is opened,
migrated, and updated column by column.

A file's schema version is `PRAGMA user_version`; migration N brings it from N to N + 1,
each in a transaction of its own, so a crash between two leaves a file one can open again.
A file newer than this Cubicle is refused, never downgraded.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any


def open_db(path: Path) -> sqlite3.Connection:
    """The file at `path` in autocommit mode (transactions are explicit), WAL, foreign keys
    on, rows readable by column name; usable from the rooms' worker threads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA foreign_keys = ON")
    return db


def migrate(db: sqlite3.Connection, migrations: Sequence[str], path: Path) -> int:
    """Run the migrations the file lacks; returns its schema version (`len(migrations)`)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > len(migrations):
        raise RuntimeError(
            f"{path} has schema version {version}, newer than this Cubicle's "
            f"({len(migrations)}): upgrade Cubicle or use another data directory"
        )
    for number in range(version, len(migrations)):
        db.executescript(
            f"BEGIN; {migrations[number]}; PRAGMA user_version = {number + 1}; COMMIT;"
        )
    return len(migrations)


def column_value(value: Any) -> Any:
    """A Python value as SQLite keeps it: times as ISO 8601 text, dicts and lists as JSON."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def assignments(changes: Mapping[str, Any], columns: Collection[str]) -> tuple[str, list[Any]]:
    """`a = ?, b = ?` and its values for an UPDATE of `changes`, whose names must all be in
    `columns` (the names go into the SQL text: only known columns may)."""
    unknown = set(changes) - set(columns)
    if unknown:
        raise ValueError(f"not updatable columns: {', '.join(sorted(unknown))}")
    return (
        ", ".join(f"{name} = ?" for name in changes),
        [column_value(value) for value in changes.values()],
    )
