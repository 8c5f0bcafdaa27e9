"""Evaluation runs on disk: `<data_dir>/evals.sqlite3`, and each run's task files and report
under `<data_dir>/evals/<run_id>/`.

`EvalStore` is blocking and not thread-safe: `cubicle.server.evals.runs.EvalRuns` calls it from one
worker thread of its own, in call order. Every task of a run is kept with the run (its
JSON, and the files it names), so a run resumes after a crash whatever happened to the
suite's folder meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cubicle.evals.suite import EvalTask
from cubicle.protocol.evals import ACTIVE, EvalItem, EvalRun, RunStatus
from cubicle.server.sqlite import assignments, migrate, open_db

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        record TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at TEXT NOT NULL,
        finished_at TEXT
    );
    CREATE TABLE tasks (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        task_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        spec TEXT NOT NULL,
        problems TEXT NOT NULL,
        PRIMARY KEY (run_id, task_id)
    );
    CREATE TABLE items (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        task_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        position INTEGER NOT NULL,
        domain TEXT NOT NULL,
        status TEXT NOT NULL,
        score REAL,
        detail TEXT,
        board_task_id INTEGER,
        agent_run_id TEXT,
        desktop_id TEXT,
        recording_id TEXT,
        steps INTEGER,
        wall_s REAL,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        started_at TEXT,
        finished_at TEXT,
        PRIMARY KEY (run_id, task_id, attempt)
    );
    CREATE INDEX items_by_status ON items (run_id, status, attempt, position);
    """,
)
"""Schema changes in order; migration N brings `user_version` from N to N + 1."""

_RUN_FIELDS = ("status", "finished_at")
_ITEM_COLUMNS = (
    "status",
    "score",
    "detail",
    "board_task_id",
    "agent_run_id",
    "desktop_id",
    "recording_id",
    "steps",
    "wall_s",
    "prompt_tokens",
    "completion_tokens",
    "started_at",
    "finished_at",
)


def now() -> datetime:
    return datetime.now(UTC)


class EvalStore:
    """Runs, their tasks and their attempts in one SQLite file (WAL, foreign keys on)."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "evals"
        self.root.mkdir(parents=True, exist_ok=True)
        path = Path(data_dir) / "evals.sqlite3"
        self._db = open_db(path)
        migrate(self._db, MIGRATIONS, path)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    # --- runs ---------------------------------------------------------------------------------

    def create(
        self,
        run: EvalRun,
        tasks: Sequence[tuple[EvalTask, list[str]]],
        files: dict[str, bytes],
    ) -> None:
        """Store a new run: its tasks (with why each is unsupported, if it is), one pending
        item per attempt (or one `unsupported` item), and the files its tasks name."""
        files_dir = self.run_dir(run.id) / "files"
        for relative, data in files.items():
            target = (files_dir / relative).resolve()
            if not target.is_relative_to(files_dir.resolve()):
                raise ValueError(f"{relative!r} leaves the run's folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        files_dir.mkdir(parents=True, exist_ok=True)
        record = run.model_dump_json(exclude={"status", "finished_at", "counts"})
        with self._transaction():
            self._db.execute(
                "INSERT INTO runs (id, record, status, created_at) VALUES (?, ?, ?, ?)",
                (run.id, record, run.status, run.created_at.isoformat()),
            )
            for position, (task, problems) in enumerate(tasks):
                self._db.execute(
                    "INSERT INTO tasks VALUES (?, ?, ?, ?, ?)",
                    (run.id, task.id, position, task.model_dump_json(), json.dumps(problems)),
                )
                attempts = 1 if problems else run.attempts
                for attempt in range(1, attempts + 1):
                    self._db.execute(
                        "INSERT INTO items (run_id, task_id, attempt, position, domain, status,"
                        " detail, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            run.id,
                            task.id,
                            attempt,
                            position,
                            task.group,
                            "unsupported" if problems else "pending",
                            "; ".join(problems) or None,
                            run.created_at.isoformat() if problems else None,
                        ),
                    )

    def run(self, run_id: str) -> EvalRun | None:
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._run(row) if row is not None else None

    def runs(self) -> list[EvalRun]:
        rows = self._db.execute("SELECT * FROM runs ORDER BY created_at DESC, id DESC")
        return [self._run(row) for row in rows.fetchall()]

    def ids_with_status(self, status: RunStatus) -> list[str]:
        rows = self._db.execute(
            "SELECT id FROM runs WHERE status = ? ORDER BY created_at", (status,)
        )
        return [row[0] for row in rows]

    def set_run(self, run_id: str, **fields: Any) -> None:
        names, values = assignments(fields, _RUN_FIELDS)
        self._db.execute(f"UPDATE runs SET {names} WHERE id = ?", [*values, run_id])

    def _run(self, row: sqlite3.Row) -> EvalRun:
        counts = dict(
            self._db.execute(
                "SELECT status, COUNT(*) FROM items WHERE run_id = ? GROUP BY status", (row["id"],)
            ).fetchall()
        )
        tasks = self._db.execute(
            "SELECT COUNT(*) FROM tasks WHERE run_id = ?", (row["id"],)
        ).fetchone()[0]
        return EvalRun.model_validate(
            json.loads(row["record"])
            | {
                "status": row["status"],
                "finished_at": row["finished_at"],
                "counts": counts,
                "tasks": tasks,
            }
        )

    # --- tasks and items ----------------------------------------------------------------------

    def tasks(self, run_id: str) -> list[tuple[EvalTask, list[str]]]:
        rows = self._db.execute(
            "SELECT spec, problems FROM tasks WHERE run_id = ? ORDER BY position", (run_id,)
        )
        return [(EvalTask.model_validate_json(s), json.loads(p)) for s, p in rows.fetchall()]

    def task(self, run_id: str, task_id: str) -> EvalTask | None:
        row = self._db.execute(
            "SELECT spec FROM tasks WHERE run_id = ? AND task_id = ?", (run_id, task_id)
        ).fetchone()
        return EvalTask.model_validate_json(row[0]) if row is not None else None

    def items(self, run_id: str) -> list[EvalItem]:
        rows = self._db.execute(
            "SELECT * FROM items WHERE run_id = ? ORDER BY position, attempt", (run_id,)
        )
        return [_item(row) for row in rows.fetchall()]

    def item(self, run_id: str, task_id: str, attempt: int) -> EvalItem | None:
        row = self._db.execute(
            "SELECT * FROM items WHERE run_id = ? AND task_id = ? AND attempt = ?",
            (run_id, task_id, attempt),
        ).fetchone()
        return _item(row) if row is not None else None

    def update_item(self, run_id: str, task_id: str, attempt: int, **fields: Any) -> None:
        names, values = assignments(fields, _ITEM_COLUMNS)
        self._db.execute(
            f"UPDATE items SET {names} WHERE run_id = ? AND task_id = ? AND attempt = ?",
            [*values, run_id, task_id, attempt],
        )

    def with_status(self, run_id: str, statuses: Sequence[str]) -> list[EvalItem]:
        """The run's items in `statuses`, first attempts first, then in suite order."""
        marks = ", ".join("?" * len(statuses))
        rows = self._db.execute(
            f"SELECT * FROM items WHERE run_id = ? AND status IN ({marks})"
            " ORDER BY attempt, position",
            (run_id, *statuses),
        )
        return [_item(row) for row in rows.fetchall()]

    def active(self, run_id: str) -> int:
        marks = ", ".join("?" * len(ACTIVE))
        return self._db.execute(
            f"SELECT COUNT(*) FROM items WHERE run_id = ? AND status IN ({marks})",
            (run_id, *ACTIVE),
        ).fetchone()[0]


def _item(row: sqlite3.Row) -> EvalItem:
    data = dict(row)
    data.pop("position")
    return EvalItem.model_validate(data)
