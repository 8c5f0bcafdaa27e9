"""The board's SQLite file on its own: migrations, queue order, interrupted runs."""

from __future__ import annotations

import sqlite3

import pytest

from cubicle.protocol.board import NewTask, TaskMove
from cubicle.server.board.db import MIGRATIONS, TaskDB

pytestmark = pytest.mark.fast


def queue(db: TaskDB) -> list[str]:
    return [task.text for task in db.list(["queued"], 0, 100)[0]]


def test_opening_a_file_twice_keeps_its_tasks_and_migrates_once(tmp_path):
    path = tmp_path / "board.sqlite3"
    db = TaskDB(path)
    db.add([NewTask(text="keep me")])
    db.close()
    again = TaskDB(path)
    assert queue(again) == ["keep me"]
    assert again.migrate() == len(MIGRATIONS)
    again.close()


def test_a_file_from_a_newer_cubicle_is_refused_not_damaged(tmp_path):
    path = tmp_path / "board.sqlite3"
    TaskDB(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(RuntimeError, match="newer than this Cubicle"):
        TaskDB(path)


def test_moves_keep_working_when_positions_run_out_of_precision(tmp_path):
    db = TaskDB(tmp_path / "board.sqlite3")
    first, second, third = db.add([NewTask(text=t) for t in ("a", "b", "c")])
    for _ in range(60):  # each move halves the gap between "a" and the moved task
        db.move(third.id, TaskMove(after=first.id))
        db.move(second.id, TaskMove(after=first.id))
    assert queue(db) == ["a", "b", "c"]
    db.move(third.id, TaskMove(before=second.id))
    assert queue(db) == ["a", "c", "b"]
    with pytest.raises(LookupError, match="not in the queue"):
        db.move(third.id, TaskMove(before=424242))


def test_tasks_a_dead_service_held_become_interrupted(tmp_path):
    db = TaskDB(tmp_path / "board.sqlite3")
    running, _ = db.add([NewTask(text="running"), NewTask(text="waiting")])
    assert db.claim(running.id, "20261122-000000-abcdef") is not None
    assert db.claim(running.id, "20261122-000000-abcdef") is None  # claimed once only
    assert db.interrupt_active() == [running.id]
    after = db.get(running.id)
    assert after is not None and after.status == "interrupted" and "retry" in after.result
    assert after.version == running.version + 2  # claimed, then interrupted: two changes
    assert queue(db) == ["waiting"]
