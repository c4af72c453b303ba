"""An MCP client made with the official Python SDK (`mcp` on PyPI), for Kiln's e2e tests.

Usage: python mcp_client.py URL HEADERS_JSON < CALLS_JSON

Connects over streamable HTTP with the given headers, initializes, lists the tools and calls
each of CALLS_JSON (a list of {"name": ..., "arguments": {...}}). Prints one JSON object: the
server's name, the tools (name, description, input schema) and each call's error flag and text.
A failure to connect or initialize is printed as {"error": ...} with exit status 1.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def run(url: str, headers: dict, calls: list) -> dict:
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http, terminate_on_close=False) as (
            read,
            write,
        ):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                listed = await session.list_tools()
                out = {
                    "server": init.server_info.name,
                    "tools": [
                        {
                            "name": t.name,
                            "description": t.description,
                            "input_schema": t.input_schema,
                        }
                        for t in listed.tools
                    ],
                    "calls": [],
                }
                for call in calls:
                    result = await session.call_tool(call["name"], call.get("arguments") or {})
                    text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
                    out["calls"].append({"name": call["name"], "is_error": bool(result.is_error), "text": text})
                return out


def main() -> int:
    url, headers = sys.argv[1], json.loads(sys.argv[2])
    calls = json.loads(sys.stdin.read() or "[]")
    try:
        out = asyncio.run(run(url, headers, calls))
    except BaseException as e:  # noqa: BLE001 - the test reads what went wrong
        print(json.dumps({"error": f"{type(e).__name__}: {e!r}"}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
