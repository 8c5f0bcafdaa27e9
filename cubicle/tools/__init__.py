"""Model tool executors: a vendor's computer tool, or Cubicle's own functions, on a desktop.

Each takes the model's tool input as the model sends it and gives back what the model
expects: `AnthropicComputer` (Claude's `computer_20250124` / `computer_20251124`),
`OpenAIComputer` (the Responses API's `computer` tool), `CubicleComputer` (the OpenAI
Agents SDK's `AsyncComputer`; `BlockingCubicleComputer` its blocking twin),
`function_tools` / `CubicleFunctions` (Cubicle's actions as JSON Schema functions).
Screens larger than what the model is shown are scaled through a `Frame`. Names load on
first use, so importing this package pulls in no vendor library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cubicle.tools.agents import BlockingCubicleComputer, CubicleComputer
    from cubicle.tools.anthropic import AnthropicComputer
    from cubicle.tools.frame import Frame
    from cubicle.tools.openai import OpenAIComputer
    from cubicle.tools.schema import CubicleFunctions, FunctionResult, function_tools
    from cubicle.tools.step import ToolStep

_HOMES = {
    "BlockingCubicleComputer": "cubicle.tools.agents",
    "CubicleComputer": "cubicle.tools.agents",
    "AnthropicComputer": "cubicle.tools.anthropic",
    "Frame": "cubicle.tools.frame",
    "OpenAIComputer": "cubicle.tools.openai",
    "CubicleFunctions": "cubicle.tools.schema",
    "FunctionResult": "cubicle.tools.schema",
    "function_tools": "cubicle.tools.schema",
    "ToolStep": "cubicle.tools.step",
}
__all__ = [
    "AnthropicComputer",
    "BlockingCubicleComputer",
    "CubicleComputer",
    "CubicleFunctions",
    "Frame",
    "FunctionResult",
    "OpenAIComputer",
    "ToolStep",
    "function_tools",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'cubicle.tools' has no attribute {name!r}")
