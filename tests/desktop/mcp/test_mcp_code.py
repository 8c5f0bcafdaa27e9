"""The run_code MCP tool, judged by the official `mcp` client over streamable HTTP."""

from __future__ import annotations

import base64
import io

from PIL import Image

from tests.desktop.mcp.test_mcp import call, connect, text_of


async def test_run_code_keeps_state_and_returns_charts_and_errors(service):
    async with connect(service, "http") as client:
        assert "run_code" in {tool.name for tool in (await client.list_tools()).tools}
        created = await call(client, "create_desktop")
        desktop_id = created.structured_content["desktop_id"]
        try:
            await call(client, "run_code", desktop_id=desktop_id, code="rows = [3, 5, 2]")
            summed = await call(client, "run_code", desktop_id=desktop_id, code="sum(rows)")
            assert "Out[" in text_of(summed) and ": 10" in text_of(summed)
            assert summed.structured_content["text"] == "10"
            chart = await call(
                client,
                "run_code",
                desktop_id=desktop_id,
                code="import matplotlib.pyplot as plt\nplt.bar(range(3), rows)\nplt.show()",
            )
            [image] = [block for block in chart.content if block.type == "image"]
            assert Image.open(io.BytesIO(base64.b64decode(image.data))).format == "PNG"
            failed = await call(client, "run_code", desktop_id=desktop_id, code="rows[7]")
            assert "IndexError: list index out of range" in text_of(failed)
            assert failed.structured_content["error"]["name"] == "IndexError"
            shell = {"desktop_id": desktop_id, "language": "bash"}
            await call(client, "run_code", code="cd /tmp && n=3", **shell)
            echoed = await call(client, "run_code", code="echo $n in $PWD", **shell)
            assert echoed.structured_content["stdout"] == "3 in /tmp\n"
        finally:
            await call(client, "kill_desktop", desktop_id=desktop_id)
