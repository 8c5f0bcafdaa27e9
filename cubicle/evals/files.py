"""The local files a suite's tasks name, so a run can carry them with it.

Tasks name files on the harness's machine by path: `upload_file`'s `local_path`,
`download`'s `url` when it is not http(s), `cloud_file`'s `path` likewise. Relative paths
start at the suite's folder. A run keeps a copy of each (in its own folder on the service),
so it runs, and resumes after a crash, wherever the suite was read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cubicle.evals.errors import SuiteError
from cubicle.evals.suite import EvalTask, Suite
from cubicle.protocol.evals import MAX_FILES_BYTES


def _names(task: EvalTask) -> Iterator[str]:
    for step in [*task.config, *task.evaluator.postconfig]:
        files: Any = step.parameters.get("files", [])
        if step.type == "upload_file" and isinstance(files, list):
            yield from (f.get("local_path", "") for f in files if isinstance(f, dict))
        if step.type == "download" and isinstance(files, list):
            yield from (f.get("url", "") for f in files if isinstance(f, dict))
    try:
        metrics = task.evaluator.metrics()
    except SuiteError:
        return
    for metric in metrics:
        for config in (metric.result, metric.expected):
            if config and config.get("type") == "cloud_file":
                paths = config.get("path", [])
                yield from [paths] if isinstance(paths, str) else paths


def referenced_files(suite: Suite) -> dict[str, bytes]:
    """Every relative local file the suite's tasks name, by that name, read from the
    suite's folder; `SuiteError` when one is missing or leaves the folder."""
    found: dict[str, bytes] = {}
    root = suite.root.resolve()
    total = 0
    for task in suite.tasks:
        for name in _names(task):
            name = name.removeprefix("file://")
            if not name or name.startswith(("http://", "https://", "/", "~")) or name in found:
                continue
            path = (root / name).resolve()
            if not path.is_relative_to(root):
                raise SuiteError(f"task {task.id}: {name!r} leaves the suite's folder")
            if not path.is_file():
                raise SuiteError(f"task {task.id} names {name!r}, but {path} does not exist")
            found[name] = path.read_bytes()
            total += len(found[name])
            if total > MAX_FILES_BYTES:
                raise SuiteError(f"{suite.name}: its files are over {MAX_FILES_BYTES // 2**20} MiB")
    return found
