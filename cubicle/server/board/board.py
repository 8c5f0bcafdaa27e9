"""The board: tasks in SQLite, a worker pool that runs them, events for the pages.

    board = Board(data_dir, services.create_desktop)
    await board.start()          # tasks a dead service held become `interrupted`
    task = (await board.add([NewTask(text="…")]))[0]
    ...
    await board.stop()           # running tasks become `interrupted`, their desktops released

Every database call runs on one thread of its own, in call order. The scheduler starts a
`TaskRun` for the first queued task whenever fewer than `concurrency` run; anything that may
free a slot or queue a task wakes it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar, Unpack

from cubicle.agent.errors import ProfileNotFound, TaskNotFound
from cubicle.agent.settings import AgentSettings, load_settings
from cubicle.agent.store import RunStore, new_run_id
from cubicle.protocol.board import (
    DEFAULT_PROFILE,
    FINISHED,
    RETRYABLE,
    BoardEvent,
    BoardSettings,
    NewTask,
    Profile,
    ProfileView,
    Task,
    TaskEdit,
    TaskMove,
    TaskPage,
    TaskStatus,
    TaskStep,
)
from cubicle.protocol.errors import Conflict, DiskFull, InvalidRequest
from cubicle.server.board.db import TaskChanges, TaskDB
from cubicle.server.board.feed import BoardFeed
from cubicle.server.board.hooks import TaskHooks, tag_prefix
from cubicle.server.board.runner import NewDesktop, RunPlan, TaskRun

log = logging.getLogger("cubicle.board")
T = TypeVar("T")

WantWarm = Callable[[int, tuple[int, int]], None]
"""Tells the service how many drawn desktops of a resolution the board wants kept ready
(its warm pool), so that the tasks it starts take one instead of booting one."""


class Board:
    """The task board of one service."""

    def __init__(
        self,
        data_dir: Path,
        new_desktop: NewDesktop,
        *,
        config: Path | None = None,
        want_warm: WantWarm | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.new_desktop = new_desktop
        """How runs start their desktop: in the service's process (`Services.create_desktop`)."""
        self.config = config
        """The agent's TOML config file for the default profile (see `cubicle.agent.settings`)."""
        self._want_warm = want_warm
        self.feed = BoardFeed()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="board-db")
        self._db: TaskDB | None = None
        self._runs: dict[int, TaskRun] = {}
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._saving: set[asyncio.Task[None]] = set()
        self._store = RunStore(self.data_dir)
        self.hooks: dict[str, TaskHooks] = {}
        """Hooks of the rooms that tag tasks, by tag prefix (see `cubicle.server.board.hooks`)."""

    async def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a database call on the board's thread; a full disk is `DiskFull` (each
        change is one transaction, so a refused one left nothing behind)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, functools.partial(method, *args, **kwargs)
            )
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
                raise
            raise DiskFull(
                f"the board's database cannot grow: the disk of {self.data_dir} is full; "
                "nothing of this change was kept: free some space and try again"
            ) from exc

    @property
    def db(self) -> TaskDB:
        if self._db is None:
            raise RuntimeError("start() the board first")
        return self._db

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._db = await self._call(TaskDB, self.data_dir / "board.sqlite3")
        interrupted = await self._call(self.db.interrupt_active)
        if interrupted:
            log.warning("tasks %s were running when the service stopped: interrupted", interrupted)
        self._ask_warm(await self.settings())
        self._scheduler = asyncio.create_task(self._schedule(), name="board-scheduler")

    async def stop(self) -> None:
        """Stop taking tasks; running ones end as `interrupted` (retry them later)."""
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
        for run in self._runs.values():
            run.ending = ("interrupted", "the service stopped while this task ran: retry it")
        workers = list(self._workers.values())
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        while self._saving:  # steps still being written: the database must see them
            await asyncio.wait(set(self._saving))
        self.feed.close()
        if self._db is not None:
            await self._call(self._db.close)
        self._executor.shutdown(wait=False)

    # --- reading ----------------------------------------------------------------------------

    async def get(self, task_id: int) -> Task:
        task = await self._call(self.db.get, task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id} on the board")
        return task

    async def list(self, statuses: Sequence[TaskStatus], offset: int, limit: int) -> TaskPage:
        items, total = await self._call(self.db.list, list(statuses), offset, limit)
        return TaskPage(items=items, total=total, offset=offset, limit=limit)

    async def counts(self) -> dict[str, int]:
        return await self._call(self.db.counts)

    async def tagged(self, prefix: str) -> list[Task]:
        """Every task whose tag starts with `prefix`, oldest first."""
        return await self._call(self.db.tagged, prefix)

    async def steps(self, task_id: int) -> list[TaskStep]:
        task = await self.get(task_id)
        if task.run_id is None:
            return []
        return await self._call(self.db.steps, task_id, task.run_id)

    # --- changing tasks ---------------------------------------------------------------------

    async def add(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Queue `tasks` (echoed back when there are at most 100)."""
        profiles = await self.profiles()
        for name in {task.profile for task in tasks}:
            if name not in profiles:
                known = ", ".join(sorted(profiles))
                raise InvalidRequest(f"unknown profile {name!r}: the board has {known}")
            if (view := self._view(name, profiles[name])).problem is not None:
                raise InvalidRequest(
                    f"the profile {name!r} cannot run tasks yet: {view.problem} (set it with "
                    f"PUT /api/board/profiles/{name} or in the board's settings)"
                )
        added = await self._call(self.db.add, list(tasks))
        if added:
            for task in added:
                self.feed.publish(BoardEvent.TASK, task=task.model_dump(mode="json"))
        else:
            self.feed.publish(BoardEvent.BULK, added=len(tasks))
        self._wake.set()
        return added

    async def edit(self, task_id: int, edit: TaskEdit) -> Task:
        task = await self._queued(task_id, "edited")
        changes = edit.model_dump(exclude_unset=True)
        if "profile" in changes and changes["profile"] not in await self.profiles():
            raise InvalidRequest(f"unknown profile {changes['profile']!r}")
        if not changes:
            return task
        return await self._update(task_id, **changes)

    async def delete(self, task_id: int) -> None:
        task = await self.get(task_id)
        if task_id in self._runs:
            raise Conflict(f"task {task_id} is {task.status}: cancel it before deleting it")
        await self._call(self.db.delete, task_id)
        self.feed.publish(BoardEvent.DELETED, id=task_id)

    async def delete_where(self, statuses: Sequence[TaskStatus]) -> int:
        """Delete every queued or finished task in `statuses`; how many went."""
        deleted = await self._call(self.db.delete_where, list(statuses))
        self.feed.publish(BoardEvent.BULK, deleted=deleted)
        return deleted

    async def move(self, task_id: int, where: TaskMove) -> Task:
        await self._queued(task_id, "moved")
        try:
            task = await self._call(self.db.move, task_id, where)
        except LookupError as exc:
            raise InvalidRequest(str(exc)) from None
        assert task is not None
        self.feed.publish(BoardEvent.MOVED, task=task.model_dump(mode="json"))
        return task

    async def cancel(self, task_id: int) -> Task:
        """Take a queued task off the queue, or stop a running one at once."""
        task = await self.get(task_id)
        if task.status == "queued":
            task = await self._finish(task_id, "cancelled", "cancelled before it started")
            if (hooks := self.hooks.get(tag_prefix(task.tag) or "")) is not None:
                await self._tell_ended(hooks, task)
            return task
        run = self._runs.get(task_id)
        if run is None:
            raise Conflict(f"task {task_id} is {task.status}: there is nothing to cancel")
        run.ending = ("cancelled", "cancelled by a person")
        return await self._stop_worker(task_id)

    async def retry(self, task_id: int) -> Task:
        task = await self.get(task_id)
        if task.status not in RETRYABLE:
            raise Conflict(
                f"task {task_id} is {task.status}: only {', '.join(RETRYABLE)} tasks are retried"
            )
        task = await self._publish(await self._call(self.db.requeue, task_id))
        self._wake.set()
        return task

    async def pause(self, task_id: int) -> Task:
        """Stop the agent acting (returns once no action is under way) so a person can use
        the desktop."""
        run = self._held(task_id, "paused")
        await run.pause()
        return await self._update(task_id, status="paused")

    async def resume(self, task_id: int) -> Task:
        run = self._held(task_id, "resumed")
        run.resume()
        return await self._update(task_id, status="running")

    async def mark_done(self, task_id: int, message: str) -> Task:
        """End a running or paused task as done, by a person's word."""
        run = self._held(task_id, "marked done")
        run.ending = ("done", f"marked done by hand{': ' + message if message else ''}")
        return await self._stop_worker(task_id)

    # --- profiles and settings --------------------------------------------------------------

    async def settings(self) -> BoardSettings:
        return await self._call(self.db.settings)

    async def put_settings(self, settings: BoardSettings) -> BoardSettings:
        await self._call(self.db.put_settings, settings)
        self._ask_warm(settings)
        self.feed.publish(BoardEvent.SETTINGS, settings=settings.model_dump(mode="json"))
        self._wake.set()
        return settings

    async def profiles(self) -> dict[str, Profile]:
        """Every profile by name; `default` (the service's environment and agent config
        file) is always there unless stored otherwise."""
        stored = await self._call(self.db.profiles)
        return {DEFAULT_PROFILE: Profile(), **stored}

    async def profile_views(self) -> list[ProfileView]:
        return [self._view(name, profile) for name, profile in (await self.profiles()).items()]

    async def put_profile(self, name: str, profile: Profile) -> ProfileView:
        await self._call(self.db.put_profile, name, profile)
        return self._view(name, profile)

    async def delete_profile(self, name: str) -> None:
        if not await self._call(self.db.delete_profile, name):
            raise ProfileNotFound(f"no profile {name!r} on the board")

    def agent_settings(self, profile: Profile, **limits: Any) -> AgentSettings:
        """The agent settings of `profile`, with `limits` ("max_steps": 5…), resolved;
        `InvalidRequest` saying what is missing."""
        flags = profile.flags() | {f"limits.{name}": value for name, value in limits.items()}
        return load_settings(flags, config=self.config).resolve()

    def _view(self, name: str, profile: Profile) -> ProfileView:
        problem = None
        try:
            self.agent_settings(profile)
        except InvalidRequest as exc:
            problem = exc.message
        return ProfileView(
            name=name,
            base_url=profile.base_url,
            api_key_set=profile.api_key is not None,
            planner_model=profile.planner_model,
            planner_kind=profile.planner_kind,
            grounder=profile.grounder,
            network=profile.network,
            ready=problem is None,
            problem=problem,
        )

    def _ask_warm(self, settings: BoardSettings) -> None:
        """One drawn desktop ready for each task that may start at once."""
        if self._want_warm is not None:
            self._want_warm(settings.concurrency, settings.resolution)

    # --- the worker pool --------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            self._wake.clear()
            try:
                settings = await self.settings()
                while len(self._runs) < settings.concurrency:
                    task = await self._call(self.db.next_queued, self._runs)
                    if task is None:
                        break
                    await self._start(task, settings)
            except Exception:  # a bug or a disk problem must not stop the board for good
                log.exception("the board's scheduler failed; trying again in a second")
                await asyncio.sleep(1)
                self._wake.set()
            await self._wake.wait()

    async def _start(self, task: Task, settings: BoardSettings) -> None:
        profiles = await self.profiles()
        hooks = None
        try:
            profile = profiles.get(task.profile)
            if profile is None:
                raise InvalidRequest(f"the profile {task.profile!r} no longer exists")
            plan = RunPlan(
                settings=self.agent_settings(
                    profile,
                    max_steps=task.max_steps or settings.max_steps,
                    max_wall_s=task.max_wall_s or settings.max_wall_s,
                ),
                profile=profile,
                resolution=settings.resolution,
                record=settings.record,
                keep_desktop_s=settings.keep_desktop_s,
            )
            hooks = self.hooks.get(tag_prefix(task.tag) or "") if task.tag else None
            if task.tag and hooks is None:
                raise InvalidRequest(f"nothing on this service runs tasks tagged {task.tag!r}")
        except InvalidRequest as exc:
            failed = await self._finish(task.id, "failed", f"cannot start: {exc.message}")
            if hooks is not None:
                await self._tell_ended(hooks, failed)
            return
        claimed = await self._call(self.db.claim, task.id, new_run_id())
        if claimed is None:
            return
        await self._publish(claimed)
        run = TaskRun(
            claimed,
            plan,
            self.new_desktop,
            self._store,
            update=self._update,
            on_step=self._on_step,
            hooks=hooks,
        )
        self._runs[task.id] = run
        self._workers[task.id] = asyncio.create_task(self._work(run), name=f"task-{task.id}")

    async def _work(self, run: TaskRun) -> None:
        task_id = run.task.id
        try:
            status, result = await run.run()
            run.ended = True
            final = await self._finish(task_id, status, result)
            run.finished.set()
            await asyncio.shield(run.release())
            if run.hooks is not None:
                await self._tell_ended(run.hooks, final)
        finally:
            run.finished.set()
            self._runs.pop(task_id, None)
            self._workers.pop(task_id, None)
            self._wake.set()

    async def _stop_worker(self, task_id: int) -> Task:
        """End a run at once; returns when its final status is stored (the desktop is
        released right after)."""
        worker, run = self._workers.get(task_id), self._runs.get(task_id)
        if worker is not None and run is not None:
            if not run.ended:  # else it is finishing on its own
                worker.cancel()
            await run.finished.wait()
        return await self.get(task_id)

    async def _tell_ended(self, hooks: TaskHooks, task: Task) -> None:
        try:
            await hooks.ended(task)
        except Exception:  # the room's problem must not take the board's worker down
            log.exception("task %s: the hooks of its tag %r failed", task.id, task.tag)

    def _on_step(self, step: TaskStep) -> None:
        async def save() -> None:
            await self._call(self.db.add_step, step)
            self.feed.publish(BoardEvent.STEP, step=step.model_dump(mode="json"))

        saving = asyncio.get_running_loop().create_task(save(), name=f"save-step-{step.task_id}")
        self._saving.add(saving)
        saving.add_done_callback(self._saving.discard)

    # --- helpers ----------------------------------------------------------------------------

    def _held(self, task_id: int, what: str) -> TaskRun:
        run = self._runs.get(task_id)
        if run is None:
            raise Conflict(f"task {task_id} is not running: only a running task can be {what}")
        return run

    async def _queued(self, task_id: int, what: str) -> Task:
        task = await self.get(task_id)
        if task.status != "queued":
            raise Conflict(f"task {task_id} is {task.status}: only queued tasks can be {what}")
        return task

    async def _update(self, task_id: int, **fields: Unpack[TaskChanges]) -> Task:
        return await self._publish(await self._call(self.db.update, task_id, **fields))

    async def _finish(self, task_id: int, status: TaskStatus, result: str | None) -> Task:
        assert status in FINISHED
        return await self._publish(await self._call(self.db.finish, task_id, status, result))

    async def _publish(self, task: Task | None) -> Task:
        if task is None:
            raise TaskNotFound("the task was deleted meanwhile")
        self.feed.publish(BoardEvent.TASK, task=task.model_dump(mode="json"))
        return task
