"""The names users import from `agent` are pinned: changing them is a breaking change."""

from __future__ import annotations

import agent
import agent.grounding
from desktop.protocol import errors


def test_public_names_are_pinned():
    assert agent.__all__ == [
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
    for name in agent.__all__:
        assert getattr(agent, name).__name__ == name
    assert agent.grounding.__all__ == [
        "FAMILIES",
        "A11yGrounder",
        "Family",
        "Grounder",
        "GrounderChain",
        "GroundingResult",
        "OcrGrounder",
        "VlmGrounder",
        "build_grounders",
        "get_family",
        "smart_resize",
    ]


def test_agent_errors_travel_like_every_other_code():
    from agent.errors import AgentError, GroundingError, ModelError

    for cls in (AgentError, GroundingError, ModelError):
        rebuilt = errors.from_code(cls.code, "message")
        assert type(rebuilt) is cls and rebuilt.message == "message"
        assert isinstance(rebuilt, errors.CubicleError)
