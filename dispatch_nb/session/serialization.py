"""A session as JSON: the saved format, written by :meth:`Session.to_json
<dispatch_nb.session.Session.to_json>` and read back by :meth:`Session.from_json
<dispatch_nb.session.Session.from_json>`.

The format knows nothing of a live session: :func:`dumps` takes its parts, :func:`loads` returns
them as a :class:`SavedSession`, and :func:`restore_tools` matches saved tool definitions with the
Python handlers given back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..tools import Tool
from ..types import Message, ToolDefinition, Usage
from .inputs import SessionTool

__all__ = ["FORMAT", "VERSION", "SavedSession", "dumps", "loads", "restore_tools"]

#: the ``format`` and ``version`` written by :meth:`Session.to_json`
FORMAT = "dispatch_nb.session"
VERSION = 1


@dataclass
class SavedSession:
    """What a saved session holds (``model`` is ``"provider:model"``)."""

    id: str
    model: str
    system: str | None
    max_tool_rounds: int
    max_tokens: int | None
    temperature: float | None
    tools: list[ToolDefinition]
    builtin_tools: list[dict[str, Any]]
    history: list[Message]
    usage: Usage


def dumps(
    *,
    id: str,
    model: str,
    system: str | None,
    max_tool_rounds: int,
    max_tokens: int | None,
    temperature: float | None,
    tools: list[SessionTool],
    history: list[Message],
    usage: Usage,
    indent: bool = False,
) -> str:
    """The JSON text of a session (tool definitions without their Python handlers)."""
    data = {
        "format": FORMAT,
        "version": VERSION,
        "id": id,
        "model": model,
        "system": system,
        "max_tool_rounds": max_tool_rounds,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "tools": [
            (t.definition if isinstance(t, Tool) else t).model_dump(mode="json")
            for t in tools
            if not isinstance(t, dict)
        ],
        "builtin_tools": [t for t in tools if isinstance(t, dict)],
        "history": [m.model_dump(mode="json") for m in history],
        "usage": usage.model_dump(mode="json"),
    }
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(data, option=option).decode()


def loads(text: str | bytes) -> SavedSession:
    """Read a saved session; a clear ``ValueError`` when ``text`` is not one (or a newer
    version)."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a saved session: the text is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a saved session: no \"format\": \"{FORMAT}\" in the JSON")
    if data.get("version") != VERSION:
        raise ValueError(
            f"this session was saved in format version {data.get('version')!r}; this version "
            f"of dispatch_nb reads version {VERSION}"
        )
    return SavedSession(
        id=data["id"],
        model=data["model"],
        system=data.get("system"),
        max_tool_rounds=data.get("max_tool_rounds", 8),
        max_tokens=data.get("max_tokens"),
        temperature=data.get("temperature"),
        tools=[ToolDefinition.model_validate(t) for t in data.get("tools", [])],
        builtin_tools=[dict(t) for t in data.get("builtin_tools", [])],
        history=[Message.model_validate(m) for m in data.get("history", [])],
        usage=Usage.model_validate(data.get("usage") or {}),
    )


def restore_tools(saved: SavedSession, given: list[SessionTool]) -> list[SessionTool]:
    """The saved tools with the ``given`` handlers re-attached by name (a given tool's current
    definition wins; extra given tools are added; saved built-in tools come last)."""
    by_name = {t.name: t for t in given if not isinstance(t, dict)}
    restored: list[SessionTool] = []
    for definition in saved.tools:
        restored.append(by_name.pop(definition.name, definition))
    restored += [t for t in given if isinstance(t, dict) or t.name in by_name]
    restored += saved.builtin_tools
    return restored
