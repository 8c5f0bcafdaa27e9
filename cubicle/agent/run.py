"""Assembling an agent from settings: the planner and grounders they name, closed after use.

    async with agent_for(desktop, settings, store=RunStore(data_dir)) as agent:
        record = await agent.run("Write a haiku in mousepad")

or, in one call, `run_task(desktop, task, settings)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from cubicle import RecordingInfo
from cubicle.agent._model import ChatModel
from cubicle.agent.grounding.base import Grounder
from cubicle.agent.loop import Agent, OnStep
from cubicle.agent.planner import ChatPlanner, Planner
from cubicle.agent.settings import TOOL_KINDS, AgentSettings
from cubicle.agent.steps import RunRecord
from cubicle.agent.store import RunStore
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol.errors import InvalidRequest


def build_planner(settings: AgentSettings, desktop: AsyncDesktop | None = None) -> Planner:
    """The planner `settings` (resolved) describe; the computer-tool planners (`anthropic`,
    `openai-computer`) need the `desktop` their tool acts on."""
    from cubicle.agent.uitars import UiTarsPlanner

    role = settings.planner
    assert role.model is not None and role.family is not None, "resolve() the settings first"
    if role.kind in TOOL_KINDS:
        return _tool_planner(settings, desktop)
    model = ChatModel(
        role.model,
        role.base_url or settings.base_url or "",
        api_key=role.api_key or settings.api_key,
        timeout_s=settings.timeout_s,
        max_retries=settings.max_retries,
        retry_backoff_s=settings.retry_backoff_s,
    )
    if role.kind == "ui-tars":
        return UiTarsPlanner(
            model, family=role.family, max_parse_retries=settings.max_parse_retries
        )
    return ChatPlanner(
        model,
        family=role.family,
        allow_exec=settings.allow_exec,
        max_parse_retries=settings.max_parse_retries,
    )


def _tool_planner(settings: AgentSettings, desktop: AsyncDesktop | None) -> Planner:
    role = settings.planner
    assert role.model is not None
    if desktop is None:
        raise InvalidRequest(f"the {role.kind} planner needs the desktop its tool acts on")
    key = role.api_key or (settings.api_key if settings.api_key != "EMPTY" else None)
    options = {
        "base_url": role.base_url or settings.base_url,
        "api_key": key,
        "max_tokens": role.max_tokens,
        "timeout_s": settings.timeout_s,
        "max_retries": settings.max_retries,
    }
    if role.kind == "anthropic":
        from cubicle.agent.claude import ClaudePlanner

        return ClaudePlanner(desktop, role.model, version=role.computer_tool, **options)
    from cubicle.agent.openai_computer import OpenAIComputerPlanner

    return OpenAIComputerPlanner(desktop, role.model, **options)


def build_grounder(settings: AgentSettings, desktop: AsyncDesktop) -> Grounder | None:
    """The grounder chain `settings` (resolved) describe; None when the planner grounds."""
    from cubicle.agent.grounding.chain import build_grounders

    role = settings.grounder
    if role.spec is None:
        return None
    return build_grounders(
        role.spec,
        desktop,
        model=role.model,
        base_url=role.base_url or settings.base_url,
        api_key=role.api_key or settings.api_key,
        family=role.family,
        timeout_s=settings.timeout_s,
        max_retries=settings.max_retries,
    )


@contextlib.asynccontextmanager
async def agent_for(
    desktop: AsyncDesktop,
    settings: AgentSettings,
    *,
    store: RunStore | None = None,
    on_step: OnStep | None = None,
    run_id: str | None = None,
    recording: RecordingInfo | None = None,
) -> AsyncIterator[Agent]:
    """An `Agent` with the models `settings` name, closed again on the way out."""
    settings = settings.resolve()
    planner = build_planner(settings, desktop)
    grounder = None
    try:
        grounder = build_grounder(settings, desktop)
        yield Agent(
            desktop,
            planner,
            grounder,
            limits=settings.limits,
            store=store,
            on_step=on_step,
            a11y_text=settings.a11y_text,
            grounder_name=settings.grounder.spec,
            run_id=run_id,
            recording=recording,
        )
    finally:
        try:
            await planner.aclose()
        finally:
            if grounder is not None:
                await grounder.aclose()


async def run_task(
    desktop: AsyncDesktop,
    task: str,
    settings: AgentSettings,
    *,
    store: RunStore | None = None,
    on_step: OnStep | None = None,
    run_id: str | None = None,
) -> RunRecord:
    """Run `task` on `desktop` with the models `settings` name; closes them afterwards."""
    async with agent_for(desktop, settings, store=store, on_step=on_step, run_id=run_id) as agent:
        return await agent.run(task)
