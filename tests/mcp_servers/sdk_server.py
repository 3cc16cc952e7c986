"""An MCP server written with the official SDK's server API (``mcp.server.mcpserver.MCPServer``),
for the tests: ``python sdk_server.py stdio`` or ``python sdk_server.py http PORT`` (streamable
HTTP on 127.0.0.1).

Tools: ``add``, ``fail`` (a tool error), ``slow`` (sleeps), ``crash`` (the process exits mid-call),
``touch`` (writes a file: the side effect the approval tests check never happens), ``picture``
(an image), ``learn`` (adds a tool and says the list changed), ``whoami`` (echoes a header).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, Image, MCPServer

server = MCPServer("dispatch-nb-test")

# a 1x1 PNG
PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ValueError(message)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """The server process exits in the middle of this call."""
    sys.stdout.flush()
    os._exit(3)


@server.tool()
def touch(path: str) -> str:
    """Create a file (the side effect approval tests watch)."""
    Path(path).write_text("touched")
    return f"created {path}"


@server.tool()
def picture() -> Image:
    """A tiny picture."""
    return Image(data=PIXEL, format="png")


@server.tool()
async def learn(name: str, ctx: Context) -> str:
    """Add a tool called ``name`` that answers its own name, and announce the change."""

    def answer() -> str:
        return f"I am {name}"

    server.add_tool(answer, name=name, description=f"Answers {name}.")
    await ctx.notify_tools_changed()
    return f"learned {name}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
