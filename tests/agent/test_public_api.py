"""The names users import from `agent` are pinned: changing them is a breaking change."""

from __future__ import annotations

import pytest

import cubicle.agent
import cubicle.agent.grounding
from cubicle.protocol import errors

pytestmark = pytest.mark.fast


def test_public_names_are_pinned():
    assert cubicle.agent.__all__ == [
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
    for name in cubicle.agent.__all__:
        assert getattr(cubicle.agent, name).__name__ == name
    assert cubicle.agent.grounding.__all__ == [
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
    from cubicle.agent.errors import AgentError, GroundingError, ModelError

    for cls in (AgentError, GroundingError, ModelError):
        rebuilt = errors.from_code(cls.code, "message")
        assert type(rebuilt) is cls and rebuilt.message == "message"
        assert isinstance(rebuilt, errors.CubicleError)
