"""The notebook's MCP servers: ``%chat mcp add|list|remove`` and ``%%chat --mcp NAMES``; a name not
added yet is looked up in ``.dispatch_nb/mcp.json`` or ``mcp.json`` (``docs/tools.md``).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from IPython.core.error import UsageError

from ..mcp import MCPServer

__all__ = ["CONFIG_FILES", "mcp_command", "resolve_servers"]

CONFIG_FILES = (Path(".dispatch_nb") / "mcp.json", Path("mcp.json"))

#: the kernel's servers by name
_servers: dict[str, MCPServer] = {}

USAGE = (
    "%chat mcp add NAME -- COMMAND ARGS… | %chat mcp add NAME --url URL | %chat mcp list | "
    "%chat mcp remove NAME"
)


def _entries(path: Path) -> dict[str, object]:
    """The ``mcpServers`` of a config file (none when there is no such file)."""
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text()).get("mcpServers", {}))
    except (ValueError, AttributeError, TypeError) as exc:
        raise UsageError(f"{path}: not an mcpServers JSON file ({exc})") from None


def _from_config(name: str) -> MCPServer | None:
    for path in CONFIG_FILES:
        entries = _entries(path)
        entry = entries.get(name)
        if isinstance(entry, dict) and "url" in entry:
            return MCPServer.http(entry["url"], entry.get("headers"), name=name)
        if isinstance(entry, dict) and "command" in entry:
            return MCPServer.stdio(entry["command"], *entry.get("args", []),
                                   env=entry.get("env"), cwd=entry.get("cwd"), name=name)
        if name in entries:  # not an object, or one with neither
            raise UsageError(f"{path}: server {name!r} needs a command or a url")
    return None


def resolve_servers(names: str | None) -> list[MCPServer]:
    """``--mcp a,b`` → the servers (added with ``%chat mcp add`` or found in mcp.json)."""
    out: list[MCPServer] = []
    for name in (n.strip() for n in (names or "").split(",")):
        if not name:
            continue
        server = _servers.get(name) or _from_config(name)
        if server is None:
            raise UsageError(
                f"no MCP server named {name!r}: add it with %chat mcp add {name} -- COMMAND ARGS… "
                f"(or --url URL), or list it in {CONFIG_FILES[0]} or mcp.json"
            )
        _servers[name] = server
        out.append(server)
    return out


def mcp_command(line: str) -> None:
    """Run ``%chat mcp …`` (``line`` is what follows ``mcp``)."""
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f"%chat mcp {line}: {exc}") from None
    verb, name = (*words, "", "")[:2]
    rest = words[2:]
    if verb == "add" and name and not name.startswith("-") and (
        (rest[:1] == ["--url"] and len(rest) == 2) or (rest[:1] == ["--"] and len(rest) >= 2)
    ):
        server = (MCPServer.http(rest[1], name=name) if rest[0] == "--url"
                  else MCPServer.stdio(rest[1], *rest[2:], name=name))
        old = _servers.pop(name, None)
        if old is not None:
            old.close()
        _servers[name] = server
        print(f"added MCP server {name} (it starts when a cell first uses it)")
    elif verb == "list":
        # the config files' servers too: --mcp NAME uses them without %chat mcp add
        unusable: dict[str, UsageError] = {}
        for listed in dict.fromkeys(n for path in CONFIG_FILES for n in _entries(path)):
            try:
                resolve_servers(listed)
            except UsageError as exc:  # one entry without a command or url: the others still list
                unusable[listed] = exc
        if not _servers and not unusable:
            print("no MCP servers: add one with " + USAGE.split(" | ")[0])
        for listed, server in _servers.items():
            tools = ", ".join(t.name for t in server.tools) or "(not listed yet)"
            error = f" — {server.error}" if server.error else ""
            print(f"{listed}: {server.state}{error}\n  tools: {tools}")
        for listed, problem in unusable.items():
            print(f"{listed}: ⚠ {problem}")
    elif verb == "remove" and name and not rest:
        config = next((path for path in CONFIG_FILES if name in _entries(path)), None)
        removed = _servers.pop(name, None)
        if removed is None and config is None:
            raise UsageError(f"no MCP server named {name!r}")
        if removed is not None:
            removed.close()
        # a config file's server comes back with the next --mcp NAME or list: say where it is
        print(f"removed MCP server {name}" if config is None else
              f"stopped MCP server {name}; {config} still names it (--mcp {name} starts it "
              "again): delete it there to remove it")
    else:
        raise UsageError(USAGE)
