"""Cubicle's computer-use agent: screenshot → planner → grounder → action → settle, repeat.

The agent drives desktops only through the `desktop` SDK, like any user program. Models
are reached through OpenAI-compatible chat-completions endpoints. Grounders turn a
description of an on-screen element into screen pixels (accessibility tree, OCR, or a
vision model of a known family); every run is recorded step by step.
"""

from __future__ import annotations

from cubicle.agent.errors import AgentError, GroundingError, ModelError
from cubicle.agent.grounding import Grounder, GroundingResult, VlmGrounder, smart_resize
from cubicle.agent.loop import Agent
from cubicle.agent.planner import ChatPlanner
from cubicle.agent.run import run_task
from cubicle.agent.settings import AgentSettings, load_settings
from cubicle.agent.store import RunStore
from cubicle.agent.uitars import UiTarsPlanner

__all__ = [
    "Agent",
    "AgentError",
    "AgentSettings",
    "ChatPlanner",
    "Grounder",
    "GroundingError",
    "GroundingResult",
    "ModelError",
    "RunStore",
    "UiTarsPlanner",
    "VlmGrounder",
    "load_settings",
    "run_task",
    "smart_resize",
]
