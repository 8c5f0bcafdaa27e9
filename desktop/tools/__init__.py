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
    from desktop.tools.agents import BlockingCubicleComputer, CubicleComputer
    from desktop.tools.anthropic import AnthropicComputer
    from desktop.tools.frame import Frame
    from desktop.tools.openai import OpenAIComputer
    from desktop.tools.schema import CubicleFunctions, FunctionResult, function_tools
    from desktop.tools.step import ToolStep

_HOMES = {
    "BlockingCubicleComputer": "desktop.tools.agents",
    "CubicleComputer": "desktop.tools.agents",
    "AnthropicComputer": "desktop.tools.anthropic",
    "Frame": "desktop.tools.frame",
    "OpenAIComputer": "desktop.tools.openai",
    "CubicleFunctions": "desktop.tools.schema",
    "FunctionResult": "desktop.tools.schema",
    "function_tools": "desktop.tools.schema",
    "ToolStep": "desktop.tools.step",
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
    raise AttributeError(f"module 'desktop.tools' has no attribute {name!r}")
