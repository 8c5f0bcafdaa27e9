"""The board's SQLite file: tasks, their steps, model profiles and settings.

`TaskDB` is blocking and not thread-safe: the board calls it from one worker thread
(`cubicle.server.board.board.Board`), so the event loop never waits on the disk. Schema changes are
numbered migrations recorded in `PRAGMA user_version`; opening a file runs those it lacks.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict, Unpack

from cubicle.protocol.board import (
    ACTIVE,
    BoardSettings,
    NewTask,
    Profile,
    Task,
    TaskMove,
    TaskStatus,
    TaskStep,
)
from cubicle.server.sqlite import assignments, migrate, open_db


class TaskChanges(TypedDict, total=False):
    """The columns of a task that `TaskDB.update` may set (the rest change only through
    their own methods: `claim`, `move`, `add_step`)."""

    text: str
    profile: str
    start: str | None
    max_steps: int | None
    max_wall_s: float | None
    status: TaskStatus
    result: str | None
    position: float
    steps: int
    desktop_id: str | None
    recording_id: str | None
    finished_at: datetime | None


MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE tasks (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        text TEXT NOT NULL,
        profile TEXT NOT NULL,
        start TEXT,
        status TEXT NOT NULL,
        result TEXT,
        position REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        steps INTEGER NOT NULL DEFAULT 0,
        max_steps INTEGER,
        max_wall_s REAL,
        run_id TEXT,
        desktop_id TEXT,
        recording_id TEXT,
        created_at TEXT NOT NULL,
        started_at TEXT,
        finished_at TEXT
    );
    CREATE INDEX tasks_by_status ON tasks (status, position);
    CREATE TABLE steps (
        task_id INTEGER NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
        run_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (run_id, idx)
    );
    CREATE INDEX steps_by_task ON steps (task_id);
    CREATE TABLE profiles (name TEXT PRIMARY KEY, profile TEXT NOT NULL);
    CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # Pages apply only news: every change to a task counts up its version.
    "ALTER TABLE tasks ADD COLUMN version INTEGER NOT NULL DEFAULT 0",
    # Tasks another room queued (an evaluation run) carry its tag.
    "ALTER TABLE tasks ADD COLUMN tag TEXT; CREATE INDEX tasks_by_tag ON tasks (tag)",
)
"""Schema changes in order; migration N brings `user_version` from N to N + 1."""

_ORDER = {
    "queued": "position, id",
    "running": "started_at, id",
    "paused": "started_at, id",
}
"""Order of tasks listed by status; finished ones (and mixed lists) come newest first."""
_FINISHED_ORDER = "finished_at DESC, id DESC"


def _now() -> str:
    return datetime.now(UTC).isoformat()


class TaskDB:
    """The board's tables in one SQLite file (WAL, foreign keys on)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_db(path)
        self.migrate()

    def close(self) -> None:
        self._db.close()

    def migrate(self) -> int:
        """Run the migrations this file lacks; returns the schema version."""
        return migrate(self._db, MIGRATIONS, self.path)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:  # SQLite rolled back by itself on a full disk
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- tasks ------------------------------------------------------------------------------

    def add(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Queue `tasks` at the end of the queue, in order."""
        now = _now()
        with self._transaction():
            last = self._db.execute("SELECT MAX(position) FROM tasks").fetchone()[0] or 0.0
            ids = []
            for offset, task in enumerate(tasks, start=1):
                cursor = self._db.execute(
                    "INSERT INTO tasks (text, profile, start, status, position, max_steps,"
                    " max_wall_s, created_at, tag) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?)",
                    (
                        task.text,
                        task.profile,
                        task.start,
                        last + offset,
                        task.max_steps,
                        task.max_wall_s,
                        now,
                        task.tag,
                    ),
                )
                ids.append(cursor.lastrowid)
        if len(ids) > 100:
            return []  # a bulk add is answered with a count, not echoed
        return [self.get(task_id) for task_id in ids if task_id is not None]  # type: ignore[misc]

    def get(self, task_id: int) -> Task | None:
        row = self._db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
        return _task(row) if row is not None else None

    def list(
        self, statuses: Sequence[TaskStatus], offset: int = 0, limit: int = 50
    ) -> tuple[list[Task], int]:
        """A page of the tasks in `statuses` (every task when empty), and how many in all."""
        where, params = "", list(statuses)
        if statuses:
            where = f"WHERE status IN ({', '.join('?' * len(statuses))})"
        orders = {_ORDER.get(status, _FINISHED_ORDER) for status in statuses}
        order = orders.pop() if len(orders) == 1 else _FINISHED_ORDER
        total = self._db.execute(f"SELECT COUNT(*) FROM tasks {where}", params).fetchone()[0]
        rows = self._db.execute(
            f"SELECT * FROM tasks {where} ORDER BY {order} LIMIT ? OFFSET ?",
            [*params, limit, offset],
        ).fetchall()
        return [_task(row) for row in rows], total

    def tagged(self, prefix: str) -> list[Task]:
        """Every task whose tag starts with `prefix`, oldest first."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._db.execute(
            "SELECT * FROM tasks WHERE tag LIKE ? ESCAPE '\\' ORDER BY id", (escaped + "%",)
        )
        return [_task(row) for row in rows]

    def counts(self) -> dict[str, int]:
        rows = self._db.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status")
        return {status: count for status, count in rows}

    def next_queued(self, skip: Iterable[int] = ()) -> Task | None:
        """The first queued task not in `skip`."""
        skipped = list(skip)
        not_in = f"AND id NOT IN ({', '.join('?' * len(skipped))})" if skipped else ""
        row = self._db.execute(
            f"SELECT * FROM tasks WHERE status = 'queued' {not_in} ORDER BY position, id LIMIT 1",
            skipped,
        ).fetchone()
        return _task(row) if row is not None else None

    def update(self, task_id: int, **changes: Unpack[TaskChanges]) -> Task | None:
        """Set columns of the task; returns it as it now is."""
        if changes:
            names, values = assignments(changes, TaskChanges.__annotations__)
            self._db.execute(
                f"UPDATE tasks SET {names}, version = version + 1 WHERE id = ?", [*values, task_id]
            )
        return self.get(task_id)

    def claim(self, task_id: int, run_id: str) -> Task | None:
        """Mark a queued task running under `run_id`; None when it is no longer queued."""
        cursor = self._db.execute(
            "UPDATE tasks SET status = 'running', run_id = ?, started_at = ?, finished_at = NULL,"
            " version = version + 1,"
            " result = NULL, steps = 0, desktop_id = NULL, recording_id = NULL,"
            " attempts = attempts + 1 WHERE id = ? AND status = 'queued'",
            (run_id, _now(), task_id),
        )
        return self.get(task_id) if cursor.rowcount else None

    def finish(self, task_id: int, status: TaskStatus, result: str | None) -> Task | None:
        return self.update(task_id, status=status, result=result, finished_at=_now())

    def requeue(self, task_id: int) -> Task | None:
        """Put a finished task back at the end of the queue."""
        last = self._db.execute("SELECT MAX(position) FROM tasks").fetchone()[0] or 0.0
        return self.update(
            task_id, status="queued", position=last + 1, result=None, finished_at=None, steps=0
        )

    def delete(self, task_id: int) -> None:
        self._db.execute("DELETE FROM tasks WHERE id = ?", (task_id,))

    def delete_where(self, statuses: Sequence[TaskStatus]) -> int:
        """Delete every task in `statuses` (never a running or paused one); how many."""
        kept = [s for s in statuses if s not in ACTIVE]
        if not kept:
            return 0
        return self._db.execute(
            f"DELETE FROM tasks WHERE status IN ({', '.join('?' * len(kept))})", kept
        ).rowcount

    def move(self, task_id: int, where: TaskMove) -> Task | None:
        """Place a queued task before/after another queued task, or at an end of the queue."""
        with self._transaction():
            position = self._position(task_id, where)
            if position is None:  # neighbours closer than float precision
                self._renumber()
                position = self._position(task_id, where)
            self._db.execute(
                "UPDATE tasks SET position = ?, version = version + 1 WHERE id = ?",
                (position, task_id),
            )
        return self.get(task_id)

    def _position(self, task_id: int, where: TaskMove) -> float | None:
        if where.to == "top":
            first = self._db.execute(
                "SELECT MIN(position) FROM tasks WHERE status = 'queued'"
            ).fetchone()[0]
            return (first or 1.0) - 1.0
        if where.to == "bottom":
            last = self._db.execute("SELECT MAX(position) FROM tasks").fetchone()[0]
            return (last or 0.0) + 1.0
        anchor_id = where.before if where.before is not None else where.after
        anchor = self.get(anchor_id)  # type: ignore[arg-type]
        if anchor is None or anchor.status != "queued":
            raise LookupError(f"task {anchor_id} is not in the queue")
        compare, order = ("<", "DESC") if where.before is not None else (">", "ASC")
        neighbour = self._db.execute(
            f"SELECT position FROM tasks WHERE status = 'queued' AND id != ? AND"
            f" position {compare} ? ORDER BY position {order} LIMIT 1",
            (task_id, anchor.position),
        ).fetchone()
        step = -1.0 if where.before is not None else 1.0
        other = neighbour[0] if neighbour is not None else anchor.position + step
        position = (anchor.position + other) / 2
        return None if position in (anchor.position, other) else position

    def _renumber(self) -> None:
        rows = self._db.execute(
            "SELECT id FROM tasks WHERE status = 'queued' ORDER BY position, id"
        ).fetchall()
        self._db.executemany(
            "UPDATE tasks SET position = ?, version = version + 1 WHERE id = ?",
            [(float(n), row[0]) for n, row in enumerate(rows, start=1)],
        )

    def interrupt_active(self) -> list[int]:
        """Mark every task a worker held as interrupted (after the service stopped)."""
        placeholders = ", ".join("?" * len(ACTIVE))
        rows = self._db.execute(
            f"SELECT id FROM tasks WHERE status IN ({placeholders})", ACTIVE
        ).fetchall()
        self._db.execute(
            f"UPDATE tasks SET status = 'interrupted', finished_at = ?, version = version + 1,"
            f" result = COALESCE(result,"
            f" 'the service stopped while this task ran: retry it') WHERE status IN"
            f" ({placeholders})",
            (_now(), *ACTIVE),
        )
        return [row[0] for row in rows]

    # --- steps ------------------------------------------------------------------------------

    def add_step(self, step: TaskStep) -> None:
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO steps (task_id, run_id, idx, record) VALUES (?, ?, ?, ?)",
                (step.task_id, step.run_id, step.index, step.model_dump_json()),
            )
            self._db.execute(
                "UPDATE tasks SET steps = MAX(steps, ?), version = version + 1"
                " WHERE id = ? AND run_id = ?",
                (step.index, step.task_id, step.run_id),
            )

    def steps(self, task_id: int, run_id: str) -> list[TaskStep]:
        rows = self._db.execute(
            "SELECT record FROM steps WHERE task_id = ? AND run_id = ? ORDER BY idx",
            (task_id, run_id),
        )
        return [TaskStep.model_validate_json(row[0]) for row in rows]

    # --- profiles and settings --------------------------------------------------------------

    def profiles(self) -> dict[str, Profile]:
        rows = self._db.execute("SELECT name, profile FROM profiles ORDER BY name")
        return {name: Profile.model_validate_json(data) for name, data in rows}

    def put_profile(self, name: str, profile: Profile) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO profiles (name, profile) VALUES (?, ?)",
            (name, profile.model_dump_json()),
        )

    def delete_profile(self, name: str) -> bool:
        return self._db.execute("DELETE FROM profiles WHERE name = ?", (name,)).rowcount > 0

    def settings(self) -> BoardSettings:
        row = self._db.execute("SELECT value FROM settings WHERE key = 'board'").fetchone()
        return BoardSettings.model_validate_json(row[0]) if row else BoardSettings()

    def put_settings(self, settings: BoardSettings) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO settings (key, value) VALUES ('board', ?)",
            (settings.model_dump_json(),),
        )


def _task(row: sqlite3.Row) -> Task:
    return Task.model_validate(dict(row))
