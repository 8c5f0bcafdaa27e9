"""MCP tool for code contexts: run code in a desktop's persistent Python or Bash context."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from cubicle.mcp.input_tools import DesktopId
from cubicle.mcp.session import Desktops, cut, guarded, result


class CodeTools:
    """Code contexts, as MCP tools."""

    def __init__(self, desktops: Desktops) -> None:
        self.desktops = desktops

    async def run_code(
        self,
        desktop_id: DesktopId,
        code: str,
        context_id: str | None = None,
        timeout_s: Annotated[float, Field(gt=0, le=3600)] = 300,
        language: Literal["python", "bash", "javascript"] = "python",
    ) -> CallToolResult:
        """Run Python in the desktop's persistent context, like a notebook cell: variables,
        imports and loaded data stay for the next call; the last expression's value, printed
        output, errors with their traceback, and charts (plt.show()) as images come back.
        pandas, numpy, matplotlib, scipy and scikit-learn are installed; files are in ~.
        language="bash" runs shell code in a persistent bash, "javascript" in Node.js."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            run = await entry.desktop.run_code(
                code,
                language=None if context_id else language,
                context=context_id,
                timeout_s=timeout_s,
            )
            parts = []
            if run.logs.stdout:
                parts.append(cut("".join(run.logs.stdout)))
            if run.logs.stderr:
                parts.append("[stderr]\n" + cut("".join(run.logs.stderr)))
            images = []
            for found in run.results:
                if found.png:
                    images.append((base64.b64decode(found.png), "image/png"))
                    parts.append("[a chart: the image below]")
                elif found.text is not None:
                    label = f"Out[{run.execution_count}]" if found.is_main_result else "[display]"
                    parts.append(f"{label}: {cut(found.text)}")
            if run.error is not None:
                parts.append(f"{run.error.name}: {run.error.value}\n{cut(run.error.traceback)}")
            text = "\n".join(parts) or "(no output)"
            data = {
                "desktop_id": desktop_id,
                "execution_count": run.execution_count,
                "text": run.text,
                "stdout": cut("".join(run.logs.stdout)),
                "stderr": cut("".join(run.logs.stderr)),
                "error": None
                if run.error is None
                else {"name": run.error.name, "value": run.error.value},
            }
            return result(text, data, *images)


TOOLS: list[Callable[..., Awaitable[CallToolResult]]] = [CodeTools.run_code]
"""The tools, in the order a client lists them."""
