"""Cubicle's computer-use agent, being built piece by piece.

Today: grounders, which turn a description of an on-screen element into screen pixels
(`VlmGrounder` over any OpenAI-compatible endpoint), and the agent's errors. The planner,
the loop and the task board come next. Names load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.errors import AgentError, GroundingError, ModelError
    from agent.grounding import Grounder, GroundingResult, VlmGrounder, smart_resize

_HOMES = {
    "agent.errors": ("AgentError", "GroundingError", "ModelError"),
    "agent.grounding": ("Grounder", "GroundingResult", "VlmGrounder", "smart_resize"),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "AgentError",
    "Grounder",
    "GroundingError",
    "GroundingResult",
    "ModelError",
    "VlmGrounder",
    "smart_resize",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
