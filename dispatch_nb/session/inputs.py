"""What a session accepts, normalized: its tools and the user's content for a turn."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter

from ..adapter import normalize_tools
from ..tools import Tool, tool
from ..types import Block, Message, TextBlock, ToolDefinition
from ..validation import BLANK_PROMPT, is_blank

__all__ = ["SessionTool", "session_tools", "user_message"]

#: one of a session's tools: runnable, declared only, or a provider built-in tool dict
SessionTool = Tool | ToolDefinition | dict[str, Any]

_BLOCK: TypeAdapter[Any] = TypeAdapter(Block)


def session_tools(tools: Any) -> list[SessionTool]:
    """``tools`` as a session keeps them: ``@tool`` objects, plain functions (wrapped with
    :func:`~dispatch_nb.tools.tool`), ``ToolDefinition`` s and dicts."""
    out: list[SessionTool] = []
    for item in tools or []:
        if isinstance(item, Tool):
            out.append(item)
        elif isinstance(item, (ToolDefinition, dict)):
            out.extend(normalize_tools([item]))
        elif callable(item):
            out.append(tool(item))
        else:
            raise TypeError(
                "a tool must be an @tool function, a typed function, a ToolDefinition or a "
                f"dict, not {type(item).__name__}"
            )
    return out


def user_message(content: Any) -> Message:
    """The user's turn for ``content``: a str, blocks (or their dicts), or a user ``Message``."""
    if isinstance(content, Message):
        if content.role != "user":
            raise ValueError("send() takes the user's turn: a Message must have role='user'")
        message = content
    elif isinstance(content, str):
        message = Message(role="user", content=content)
    elif isinstance(content, dict) and "role" in content:
        return user_message(Message.model_validate(content))
    elif isinstance(content, (list, tuple)):
        message = Message(role="user", content=[_block(item) for item in content])
    elif isinstance(content, (dict, BaseModel)):
        message = Message(role="user", content=[_block(content)])
    else:
        raise TypeError(
            f"content must be a str, a list of blocks or a user Message, not {type(content).__name__}"
        )
    if not message.blocks:
        raise ValueError("there is nothing to send: the content is empty")
    if is_blank(message):
        raise ValueError(BLANK_PROMPT)
    return message


def _block(item: Any) -> Any:
    if isinstance(item, str):
        return TextBlock(text=item)
    if isinstance(item, dict):
        return _BLOCK.validate_python(item)
    if isinstance(item, BaseModel) and getattr(item, "type", None) is not None:
        return item
    raise TypeError(f"a content block must be a str, a dict or a block, not {type(item).__name__}")
