"""A session as JSON, the format of :meth:`Session.to_json <dispatch_nb.session.Session.to_json>`
and :meth:`Session.from_json <dispatch_nb.session.Session.from_json>`; it knows nothing of a live
session.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from ..types import Message, ToolDefinition, Usage
from .inputs import SessionTool

__all__ = ["FORMAT", "VERSION", "SavedSession", "loads", "restore_tools"]

#: the ``format`` and ``version`` written by :meth:`Session.to_json`
FORMAT = "dispatch_nb.session"
VERSION = 1


class SavedSession(BaseModel):
    """What a saved session holds (``model`` is ``"provider:model"``), and its JSON text."""

    id: str
    model: str
    system: str | None = None
    max_tool_rounds: int = 8
    max_tokens: int | None = None
    temperature: int | float | None = None  # as given: a whole number stays one in the JSON
    tools: list[ToolDefinition] = []
    builtin_tools: list[dict[str, Any]] = []
    history: list[Message] = []
    usage: Usage = Usage()

    def dumps(self, *, indent: bool = False) -> str:
        """The JSON text of the session, ``format`` and ``version`` first."""
        data = {"format": FORMAT, "version": VERSION, **self.model_dump(mode="json")}
        return orjson.dumps(data, option=orjson.OPT_INDENT_2 if indent else 0).decode()


def loads(text: str | bytes) -> SavedSession:
    """Read a saved session; a clear ``ValueError`` when ``text`` is not one (or a newer
    version)."""
    if not isinstance(text, (str, bytes)):
        raise TypeError("from_json() takes the text session.to_json() returned (a str) — not "
                        f"{type(text).__name__}")
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
    return SavedSession.model_validate(data)


def restore_tools(saved: SavedSession, given: list[SessionTool]) -> list[SessionTool]:
    """The saved tools with the ``given`` handlers re-attached by name (a given tool's current
    definition wins; extra given tools are added; saved built-in tools come last)."""
    by_name = {t.name: t for t in given if not isinstance(t, dict)}
    restored: list[SessionTool] = [by_name.pop(d.name, d) for d in saved.tools]
    restored += [t for t in given if isinstance(t, dict) or t.name in by_name]
    restored += saved.builtin_tools
    return restored
