"""Evaluation runs on the task board: each task attempt is a board task tagged with the run.

    runs = EvalRuns(board, data_dir, suites={"evals": Path("evals")})
    await runs.start()             # resumes the runs a dead service left running
    run = await runs.create(NewEvalRun(suite="evals", attempts=2))
    ...
    await runs.stop()

The board stays the one scheduler and worker pool: a run only feeds it, keeping at most
`concurrency` of its attempts queued or running, first attempts first. The board's hooks
(`cubicle.server.board.hooks`) set each fresh desktop up before the agent, score it after, and say
when the attempt is over, which frees the slot for the next. Whatever stops the service, a
run's verdicts are on disk: at the next start every attempt without a verdict is run again
(the same board card, retried), and no attempt with one is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from cubicle import Conflict, InvalidRequest, NotFound
from cubicle.agent.store import new_run_id
from cubicle.evals.check import unsupported
from cubicle.evals.errors import EvalRunNotFound, SuiteError
from cubicle.evals.files import referenced_files
from cubicle.evals.suite import Suite, load_suite, parse_task
from cubicle.protocol.board import NewTask, Task
from cubicle.protocol.evals import (
    ACTIVE,
    MAX_FILES_BYTES,
    Comparison,
    EvalItem,
    EvalReport,
    EvalRun,
    NewEvalRun,
)
from cubicle.server.board.board import Board
from cubicle.server.evals import stats
from cubicle.server.evals.hooks import TAG, EvalHooks, tag_for
from cubicle.server.evals.store import EvalStore, now

log = logging.getLogger("cubicle.evals")
T = TypeVar("T")

CHECK_EVERY_S = 5.0
"""Seconds between looks for attempts whose board task a person deleted."""


class EvalRuns:
    """The evaluation runs of one service, fed to its task board."""

    def __init__(self, board: Board, data_dir: Path, suites: dict[str, Path]) -> None:
        self.board = board
        self.data_dir = Path(data_dir)
        self.suites = dict(suites)
        """Suites the service offers by name (the page's "Run suite"), name → folder."""
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="evals-db")
        self._store: EvalStore | None = None
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None
        self.stopped = False
        """Set by `stop()`: the hooks ignore what the board says afterwards."""

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`method` (of the store) on the store's own thread, in call order."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, functools.partial(method, *args, **kwargs)
        )

    @property
    def store(self) -> EvalStore:
        if self._store is None:
            raise RuntimeError("start() the evaluation runs first")
        return self._store

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._store = await self.call(EvalStore, self.data_dir)
        self.board.hooks[TAG] = EvalHooks(self)
        for run_id in await self.call(self.store.ids_with_status, "running"):
            await self._reconcile(run_id)
        for run_id in await self.call(self.store.ids_with_status, "stopped"):
            for item in await self.call(self.store.with_status, run_id, ACTIVE):
                await self.update_item(item, status="pending")
        self._watch = asyncio.create_task(self._keep_watch(), name="evals-watch")

    async def stop(self) -> None:
        """Stop feeding the board; attempts under way are picked up at the next start."""
        self.stopped = True
        self.board.hooks.pop(TAG, None)
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        async with self._lock:  # no feed or verdict is half-written
            if self._store is not None:
                await self.call(self._store.close)
                self._store = None
        self._executor.shutdown(wait=False)

    # --- runs ---------------------------------------------------------------------------------

    async def create(self, request: NewEvalRun) -> EvalRun:
        """Store a new run and start feeding its attempts to the board."""
        suite, files = await self._tasks_of(request)
        tasks = suite.tasks
        if request.task_ids is not None:
            missing = sorted(set(request.task_ids) - {task.id for task in tasks})
            if missing:
                raise InvalidRequest(f"the suite {suite.name!r} has no task {missing[0]!r}")
            tasks = [task for task in tasks if task.id in set(request.task_ids)]
        profiles = await self.board.profiles()
        profile = profiles.get(request.profile)
        if profile is None:
            raise InvalidRequest(f"unknown profile {request.profile!r}: {', '.join(profiles)}")
        settings = self.board.agent_settings(profile)  # InvalidRequest when it cannot run
        board_settings = await self.board.settings()
        concurrency = request.concurrency or max(1, board_settings.concurrency)
        if concurrency > board_settings.concurrency:
            changed = board_settings.model_copy(update={"concurrency": concurrency})
            await self.board.put_settings(changed)
        run = EvalRun(
            id=f"eval-{new_run_id()}",
            name=request.name or f"{suite.name} · {settings.planner.model}",
            suite=suite.name,
            profile=request.profile,
            model=settings.planner.model,
            status="running",
            attempts=request.attempts,
            concurrency=concurrency,
            max_steps=request.max_steps,
            max_wall_s=request.max_wall_s,
            created_at=now(),
        )
        checked = [(task, unsupported(task)) for task in tasks]
        await self.call(self.store.create, run, checked, files)
        await self.feed(run.id)
        return await self.get(run.id)

    async def _tasks_of(self, request: NewEvalRun) -> tuple[Suite, dict[str, bytes]]:
        if request.suite is not None:
            folder = self.suites.get(request.suite)
            if folder is None:
                known = ", ".join(sorted(self.suites)) or "none"
                raise InvalidRequest(f"no suite {request.suite!r} here (known: {known})")
            suite = await asyncio.to_thread(load_suite, folder)
            return suite, await asyncio.to_thread(referenced_files, suite)
        assert request.tasks is not None
        tasks = [parse_task(data, where=f"tasks[{n}]") for n, data in enumerate(request.tasks)]
        files: dict[str, bytes] = {}
        for name, encoded in request.files.items():
            parts = Path(name).parts
            if not parts or Path(name).is_absolute() or ".." in parts:
                raise SuiteError(f"files[{name!r}]: name it by its path inside the suite's folder")
            try:
                files[name] = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise SuiteError(f"files[{name!r}] is not base64") from None
        if sum(len(data) for data in files.values()) > MAX_FILES_BYTES:
            raise SuiteError(f"the task files are over {MAX_FILES_BYTES // 2**20} MiB")
        return Suite(request.name or "inline", self.data_dir, tasks), files

    async def get(self, run_id: str) -> EvalRun:
        run = await self.call(self.store.run, run_id)
        if run is None:
            raise EvalRunNotFound(f"no evaluation run {run_id}")
        return run

    async def list(self) -> list[EvalRun]:
        return await self.call(self.store.runs)

    async def report(self, run_id: str) -> EvalReport:
        run = await self.get(run_id)
        items = await self.call(self.store.items, run_id)
        tasks = await self.call(self.store.tasks, run_id)
        return EvalReport(
            run=run,
            summary=stats.summarize(items, run.attempts),
            domains=stats.domains(items),
            tasks=stats.task_rows(
                items,
                {task.id: task.instruction for task, _ in tasks},
                {task.id: problems for task, problems in tasks if problems},
            ),
            items=items,
        )

    async def compare(self, a_id: str, b_id: str) -> Comparison:
        a, b = await self.get(a_id), await self.get(b_id)
        a_items = await self.call(self.store.items, a_id)
        b_items = await self.call(self.store.items, b_id)
        return stats.compare(a, a_items, b, b_items)

    async def stop_run(self, run_id: str) -> EvalRun:
        """Stop a run: its queued and running attempts are cancelled (and will run again
        on resume); attempts with a verdict keep it."""
        run = await self.get(run_id)
        if run.status != "running":
            raise Conflict(f"evaluation run {run_id} is {run.status}: only a running run stops")
        async with self._lock:
            await self.call(self.store.set_run, run_id, status="stopped")
        for item in await self.call(self.store.with_status, run_id, ACTIVE):
            if item.board_task_id is not None:
                with contextlib.suppress(Conflict, NotFound):  # it ended meanwhile
                    await self.board.cancel(item.board_task_id)
        for item in await self.call(self.store.with_status, run_id, ACTIVE):
            await self.update_item(item, status="pending")
        await self._write_report(run_id)
        return await self.get(run_id)

    async def resume_run(self, run_id: str) -> EvalRun:
        """Go on with a stopped run: only attempts without a verdict run."""
        run = await self.get(run_id)
        if run.status != "stopped":
            raise Conflict(f"evaluation run {run_id} is {run.status}: only a stopped run resumes")
        async with self._lock:
            await self.call(self.store.set_run, run_id, status="running", finished_at=None)
        await self.feed(run_id)
        return await self.get(run_id)

    # --- feeding the board --------------------------------------------------------------------

    async def feed(self, run_id: str) -> None:
        """Queue the run's next attempts while it has free slots; close it when done."""
        async with self._lock:
            if self.stopped:
                return
            run = await self.call(self.store.run, run_id)
            if run is None or run.status != "running":
                return
            free = run.concurrency - await self.call(self.store.active, run_id)
            pending = await self.call(self.store.with_status, run_id, ["pending"])
            for item in pending[: max(0, free)]:
                await self._queue(run, item)
            left = await self.call(self.store.with_status, run_id, ["pending", *ACTIVE])
            if left:
                return
            await self.call(self.store.set_run, run_id, status="done", finished_at=now())
        log.info("evaluation run %s is done", run_id)
        await self._write_report(run_id)

    async def _queue(self, run: EvalRun, item: EvalItem) -> None:
        await self.update_item(item, status="queued")
        if item.board_task_id is not None:
            try:
                await self.board.retry(item.board_task_id)
                return
            except (Conflict, NotFound):
                pass  # deleted, or not retryable: a new card
        task = await self.call(self.store.task, run.id, item.task_id)
        assert task is not None
        new = NewTask(
            text=task.instruction,
            profile=run.profile,
            max_steps=run.max_steps,
            max_wall_s=run.max_wall_s,
            tag=tag_for(run.id, item.task_id, item.attempt),
        )
        try:
            added = await self.board.add([new])
        except InvalidRequest as exc:
            await self.update_item(item, status="error", detail=exc.message, finished_at=now())
            return
        if added:
            await self.update_item(item, board_task_id=added[0].id)

    async def _reconcile(self, run_id: str) -> None:
        """After a restart: match the run's attempts without a verdict with their board
        tasks; those whose task is gone or ended without a verdict run again."""
        latest: dict[str, Task] = {}
        for task in await self.board.tagged(f"{TAG}:{run_id}:"):
            latest[task.tag or ""] = task
        for item in await self.call(self.store.with_status, run_id, ACTIVE):
            task = latest.get(tag_for(run_id, item.task_id, item.attempt))
            if task is None:
                await self.update_item(item, status="pending", board_task_id=None)
            elif task.status in ("queued", "running", "paused"):
                await self.update_item(item, board_task_id=task.id)
            else:
                await self.update_item(item, status="pending", board_task_id=task.id)
        await self.feed(run_id)

    async def _keep_watch(self) -> None:
        """Every few seconds: attempts whose board task a person deleted run again."""
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                for run_id in await self.call(self.store.ids_with_status, "running"):
                    tags = {t.tag for t in await self.board.tagged(f"{TAG}:{run_id}:")}
                    for item in await self.call(self.store.with_status, run_id, ACTIVE):
                        if tag_for(run_id, item.task_id, item.attempt) not in tags:
                            await self.update_item(item, status="pending", board_task_id=None)
                    await self.feed(run_id)
            except Exception:  # a disk problem must not end the watch for good
                log.exception("watching the evaluation runs failed; looking again soon")

    # --- helpers ------------------------------------------------------------------------------

    async def update_item(self, item: EvalItem, **fields: Any) -> None:
        """Set `fields` of one attempt on disk."""
        await self.call(self.store.update_item, item.run_id, item.task_id, item.attempt, **fields)

    async def _write_report(self, run_id: str) -> None:
        """`<data_dir>/evals/<run_id>/report.json`: the run's report as it stands."""
        report = await self.report(run_id)
        path = self.store.run_dir(run_id) / "report.json"

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".part")
            partial.write_text(report.model_dump_json(indent=2))
            partial.replace(path)

        await asyncio.to_thread(write)
