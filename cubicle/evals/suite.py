"""Suites of OSWorld-format tasks: the task model, and reading a folder or a JSON file of them.

A task is OSWorld's JSON as it stands (`id`, `instruction`, `config[]` setup steps,
`evaluator{func, result, expected, options, postconfig, conj}`, plus fields Cubicle keeps
but does not use: `snapshot`, `source`, `related_apps`…). A suite is any of:

- a folder of task files (`<folder>/<domain>/<id>.json`, or flat), the domain being the
  sub-folder's name;
- OSWorld's index file (`test_all.json`: `{"chrome": ["<id>", …], …}`) whose tasks live in
  `examples/<domain>/<id>.json` next to it, or a folder holding one;
- one JSON file: a task, a list of tasks, or `{"name": …, "tasks": [...]}`.

Setup parameters, getter configs and metric options stay free-form here, as OSWorld writes
them; `cubicle.evals.setup` and `cubicle.evals.getters` check each against its own typed model
when the task runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from cubicle.evals.errors import SuiteError

TaskId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
INDEX_NAMES = ("test_all.json", "test_small.json")
"""OSWorld's index files, in the order a folder's is looked for."""
MAX_TASKS = 5_000
"""Tasks one suite may hold."""
_MAX_FILE_BYTES = 4 * 1024 * 1024
"""Largest task file read."""


class SetupStep(BaseModel):
    """One entry of `config[]` or `postconfig[]`: a step type and its keyword parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class Evaluator(BaseModel):
    """How a task is scored. `func` may be a list: then `result`, `expected` and `options`
    are lists of the same length (an entry may be null) and `conj` combines the scores."""

    model_config = ConfigDict(extra="allow", frozen=True)

    func: str | list[str]
    conj: Literal["and", "or"] = "and"
    result: dict[str, Any] | list[dict[str, Any] | None] | None = None
    expected: dict[str, Any] | list[dict[str, Any] | None] | None = None
    options: dict[str, Any] | list[dict[str, Any] | None] | None = None
    postconfig: list[SetupStep] = Field(default_factory=list)

    def metrics(self) -> list[Metric]:
        """The metrics to compute, one per `func` entry, their configs aligned."""
        if isinstance(self.func, str):
            return [
                Metric(
                    self.func,
                    _single(self.result),
                    _single(self.expected),
                    _single(self.options) or {},
                )
            ]
        count = len(self.func)
        results, expected, options = (
            _aligned(name, value, count)
            for name, value in (
                ("result", self.result),
                ("expected", self.expected),
                ("options", self.options),
            )
        )
        return [
            Metric(func, results[i], expected[i], options[i] or {})
            for i, func in enumerate(self.func)
        ]


@dataclass(frozen=True)
class Metric:
    """One metric of an evaluator with its getters' configs."""

    func: str
    result: dict[str, Any] | None
    """Config of the getter whose value is the metric's first argument."""
    expected: dict[str, Any] | None
    """Config of the getter whose value is the metric's second argument, if any."""
    options: dict[str, Any]
    """Keyword arguments of the metric."""


def _single(value: Any) -> Any:
    if isinstance(value, list):
        raise SuiteError("a single `func` takes a single result/expected/options, not a list")
    return value


def _aligned(name: str, value: Any, count: int) -> list[Any]:
    if value is None or value == {} or value == []:
        return [None] * count
    if not isinstance(value, list) or len(value) != count:
        raise SuiteError(f"`func` lists {count} metrics: `{name}` must be a list of {count}")
    return value


class EvalTask(BaseModel):
    """One OSWorld-format task."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: TaskId
    instruction: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
    config: list[SetupStep] = Field(default_factory=list)
    evaluator: Evaluator
    snapshot: str | None = None
    """The VM snapshot OSWorld restores first; Cubicle starts every task on a fresh desktop."""
    source: str | None = None
    related_apps: list[str] = Field(default_factory=list)
    domain: str = ""
    """The suite's sub-folder (or index key) the task came from; "" when flat. Cubicle's own
    field: reports break results down by it."""

    @property
    def group(self) -> str:
        """What reports group the task under: its domain, else its first related app."""
        return self.domain or (self.related_apps[0] if self.related_apps else "other")


@dataclass(frozen=True)
class Suite:
    """Tasks read from one place."""

    name: str
    root: Path
    """The folder local paths in the tasks (`upload_file`'s `local_path`) are relative to."""
    tasks: list[EvalTask] = field(default_factory=list)

    def task(self, task_id: str) -> EvalTask:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise SuiteError(f"the suite {self.name!r} has no task {task_id!r}")


def parse_task(data: Any, *, domain: str = "", where: str = "the task") -> EvalTask:
    """An `EvalTask` from decoded JSON; `SuiteError` saying what is wrong and where."""
    if isinstance(data, dict) and domain and not data.get("domain"):
        data = {**data, "domain": domain}
    try:
        return EvalTask.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'task'}: {error['msg']}"
            for error in exc.errors()[:4]
        )
        raise SuiteError(f"{where} is not an OSWorld task: {problems}") from None


def load_suite(path: Path | str) -> Suite:
    """Read a suite from a folder or a JSON file (see the module); `SuiteError` when it
    cannot be read, naming the file."""
    path = Path(path).expanduser()
    if path.is_dir():
        index = next((path / name for name in INDEX_NAMES if (path / name).is_file()), None)
        if index is not None:
            return _from_index(index, _read(index), name=path.resolve().name)
        tasks = [
            parse_task(_read(file), domain=_domain(path, file), where=str(file))
            for file in sorted(path.rglob("*.json"))
            if not file.name.startswith(("_", "."))
        ]
        return _suite(path.resolve().name, path, tasks)
    if not path.is_file():
        raise SuiteError(f"{path} is neither a folder of tasks nor a JSON file")
    data = _read(path)
    if isinstance(data, list):
        tasks = [parse_task(item, where=f"{path} item {n}") for n, item in enumerate(data)]
        return _suite(path.stem, path.parent, tasks)
    if isinstance(data, dict) and "instruction" in data:
        return _suite(path.stem, path.parent, [parse_task(data, where=str(path))])
    if isinstance(data, dict) and isinstance(data.get("tasks"), list):
        tasks = [parse_task(item, where=f"{path} task {n}") for n, item in enumerate(data["tasks"])]
        return _suite(str(data.get("name") or path.stem), path.parent, tasks)
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        return _from_index(path, data, name=path.stem)
    raise SuiteError(f"{path} is not a task, a list of tasks, a suite object or an OSWorld index")


def _from_index(index: Path, data: Any, *, name: str) -> Suite:
    if not isinstance(data, dict):
        raise SuiteError(f"{index} is not an OSWorld index ({{domain: [task ids]}})")
    examples = index.parent / "examples"
    tasks = []
    for domain, ids in data.items():
        for task_id in ids:
            file = examples / str(domain) / f"{task_id}.json"
            if not file.is_file():
                raise SuiteError(f"{index} lists {domain}/{task_id}, but {file} does not exist")
            tasks.append(parse_task(_read(file), domain=str(domain), where=str(file)))
    return _suite(name, index.parent, tasks)


def _suite(name: str, root: Path, tasks: list[EvalTask]) -> Suite:
    if not tasks:
        raise SuiteError(f"no tasks found in {root} ({name})")
    if len(tasks) > MAX_TASKS:
        raise SuiteError(f"{name} holds {len(tasks)} tasks; a suite may hold {MAX_TASKS}")
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise SuiteError(f"{name}: two tasks have the id {task.id!r}")
        seen.add(task.id)
    return Suite(name, root.resolve(), tasks)


def _domain(root: Path, file: Path) -> str:
    parts = file.relative_to(root).parts
    return parts[0] if len(parts) > 1 else ""


def _read(file: Path) -> Any:
    if file.stat().st_size > _MAX_FILE_BYTES:
        raise SuiteError(f"{file} is over {_MAX_FILE_BYTES // 1024 // 1024} MiB")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SuiteError(f"{file} is not JSON: {exc}") from None
