"""Real MCP servers for the tests: the SDK-written server in ``tests/mcp_servers/sdk_server.py``
(stdio, and streamable HTTP on 127.0.0.1) and the npm reference servers ``server-everything`` and
``server-filesystem`` installed in ``tests/mcp_servers/node_modules`` (``npm ci`` there; .ci/run
does it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch_nb.mcp import MCPServer

SERVERS = Path(__file__).resolve().parents[1] / "mcp_servers"
SDK_SERVER = SERVERS / "sdk_server.py"
NODE_MODULES = SERVERS / "node_modules" / "@modelcontextprotocol"
EVERYTHING = NODE_MODULES / "server-everything" / "dist" / "index.js"
FILESYSTEM = NODE_MODULES / "server-filesystem" / "dist" / "index.js"


def sdk_stdio(**options: object) -> MCPServer:
    return MCPServer.stdio(sys.executable, str(SDK_SERVER), "stdio", **options)  # type: ignore[arg-type]


def npm_server(script: Path, *args: str, name: str) -> MCPServer:
    if not script.exists():
        pytest.skip(f"{script} is missing: run `npm ci` in tests/mcp_servers")
    return MCPServer.stdio("node", str(script), *args, name=name)


@pytest.fixture
def sdk_server() -> Iterator[MCPServer]:
    server = sdk_stdio(name="calc", timeout=30)
    yield server
    server.close()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The SDK server over streamable HTTP on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(SDK_SERVER), "http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("the SDK's HTTP server did not start")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)
