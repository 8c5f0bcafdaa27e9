"""The rooms' SQLite files: migrations run once each, in order, and a newer file is refused;
an update names only the columns it may."""

from __future__ import annotations

import pytest

from cubicle.server.board.db import TaskDB
from cubicle.server.sqlite import assignments, migrate, open_db

pytestmark = pytest.mark.fast

STEPS = ("CREATE TABLE t (a TEXT)", "ALTER TABLE t ADD COLUMN b INTEGER")


def test_migrations_run_once_each_in_order(tmp_path):
    path = tmp_path / "x.sqlite3"
    db = open_db(path)
    assert migrate(db, STEPS[:1], path) == 1
    db.execute("INSERT INTO t (a) VALUES ('kept')")
    assert migrate(db, STEPS, path) == 2
    assert migrate(db, STEPS, path) == 2  # nothing left to run
    assert [tuple(r) for r in db.execute("SELECT a, b FROM t")] == [("kept", None)]


def test_a_file_newer_than_this_cubicle_is_refused(tmp_path):
    path = tmp_path / "x.sqlite3"
    migrate(open_db(path), STEPS, path)
    with pytest.raises(RuntimeError, match="newer than this Cubicle"):
        migrate(open_db(path), STEPS[:1], path)


def test_an_update_names_only_known_columns():
    assert assignments({"a": 1, "b": [2]}, ("a", "b")) == ("a = ?, b = ?", [1, "[2]"])
    with pytest.raises(ValueError, match="id = 1; DROP"):
        assignments({"id = 1; DROP": 1}, ("a",))


def test_the_board_updates_a_task_and_refuses_other_columns(tmp_path):
    from cubicle.protocol.board import NewTask

    db = TaskDB(tmp_path / "board.sqlite3")
    [task] = db.add([NewTask(text="open the editor")])
    assert db.update(task.id, result="done", steps=3).result == "done"
    with pytest.raises(ValueError, match="not updatable columns: run_id"):
        db.update(task.id, run_id="forged")  # type: ignore[call-arg]
