"""Checks at the public entry points: bad arguments fail before any request, saying what is wrong
and what is accepted.

::

    llm.chat(42)                  TypeError: messages must be a str, a Message, a dict with 'role'
                                  and 'content', or a list of those — not 42 (an int)
    llm.chat("hi", max_tokens="100")
                                  TypeError: max_tokens must be a whole number of tokens above 0
                                  (e.g. max_tokens=1024) or None — not '100' (a str)

A wrong type raises ``TypeError``, a value out of range ``ValueError`` (:class:`CallArguments`:
no coercion). Text that cannot be encoded (lone surrogates) is replaced: :func:`clean_messages`.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import os
import re
import warnings
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "CallArguments",
    "check_call",
    "check_messages",
    "check_tools",
    "is_blank",
    "replace_lone_surrogates",
    "surrogate_note",
]

#: what each checked argument accepts, in words
ACCEPTED: dict[str, str] = {
    "system": "a str (the system prompt) or None",
    "max_tokens": "a whole number of tokens above 0 (e.g. max_tokens=1024) or None",
    "temperature": "a number from 0 to 2 (e.g. temperature=0.2) or None",
    "timeout": "a number of seconds above 0 (e.g. timeout=30) or None",
    "stream": "True or False",
    "max_tool_rounds": "a whole number, 0 or more",
    "max_retries": "a whole number, 0 or more",
    "id": "a str or None",
}


class CallArguments(BaseModel):
    """The keyword arguments of ``chat`` / ``stream`` / ``achat`` / ``astream`` and of
    ``Session``, checked strictly (no coercion: ``"100"`` is not 100)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    system: str | None = None
    max_tokens: Annotated[int, Field(gt=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    timeout: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    stream: bool = False
    max_tool_rounds: Annotated[int, Field(ge=0)] = 8
    max_retries: Annotated[int, Field(ge=0)] | None = None
    id: str | None = None


def article(noun: str) -> str:
    """``"an int"``, ``"a str"``: the noun with its indefinite article."""
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def describe(value: Any) -> str:
    """``'100' (a str)``, ``42 (an int)``: a value for an error message, shortened."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({article(type(value).__name__)})" if value is not None else "None"


def check_call(where: str = "", **values: Any) -> None:
    """Check the given keyword arguments (only those present) against :class:`CallArguments`;
    raise ``TypeError`` / ``ValueError`` naming the argument, what it accepts and what it got.
    ``where`` prefixes the message (e.g. ``"Session: "``)."""
    try:
        CallArguments.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "?"
        message = (f"{where}{name} must be {ACCEPTED.get(name, 'something else')} — not "
                   f"{describe(values.get(name))}")
        # A number of the right kind that is out of range is a ValueError; anything else a TypeError.
        range_error = str(first.get("type", "")).startswith(
            ("greater_than", "less_than", "finite_number"))
        raise (ValueError if range_error else TypeError)(message) from None


def check_tools(tools: Any) -> None:
    """Raise ``TypeError`` when ``tools`` is one tool (a function, an ``@tool``, a definition, a
    dict, an MCP server) rather than a list of them."""
    if tools is None or isinstance(tools, (list, tuple, set, frozenset)):
        return
    if isinstance(tools, (str, bytes, dict)) or callable(tools) or hasattr(tools, "definition") \
            or hasattr(tools, "list_tools") or type(tools).__name__ == "ToolDefinition":
        raise TypeError(f"tools= takes a list of tools, e.g. tools=[get_weather] — not one: "
                        f"{describe(tools)}")


def check_messages(messages: Any) -> None:
    """Raise ``TypeError`` unless ``messages`` is what ``chat`` accepts: a str, a ``Message``, a
    dict with a role, or a list / tuple of those."""
    from .types import Message

    def ok(item: Any) -> bool:
        return isinstance(item, (str, Message)) or (isinstance(item, dict) and "role" in item)

    if ok(messages):
        return
    if not isinstance(messages, (list, tuple)):
        wrong = f"not {describe(messages)}"
    elif (i := next((i for i, item in enumerate(messages) if not ok(item)), None)) is not None:
        wrong = f"item {i} is {describe(messages[i])}"
    else:
        return
    raise TypeError(
        f"messages must be a str, a Message, a dict with 'role' and 'content', or a list of "
        f"those — {wrong}"
    )


#: what plain Python is told when a prompt holds nothing but whitespace (``%%chat``'s empty cell)
BLANK_PROMPT = ("there is nothing to send: the prompt is empty or only whitespace — write what to "
                "ask (whitespace is allowed only next to an image or a tool result)")


def is_blank(message: Any) -> bool:
    """Whether a user ``Message`` says nothing: no text but whitespace, and no other block (an
    image, a tool result, a block kept for its provider all count as something)."""
    from .types import TextBlock

    if message.role != "user":
        return False
    if isinstance(message.content, str):
        return not message.content.strip()
    return all(isinstance(b, TextBlock) and not b.text.strip() and not b.provider_data
               for b in message.content)


_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(text: str) -> tuple[str, int]:
    """``text`` with every lone surrogate replaced by U+FFFD, and how many there were.

    Python strings hold a surrogate only when it is unpaired (``os.listdir`` decodes a file name
    that is not UTF-8 with ``surrogateescape``; JSON can carry one): such a string cannot be
    encoded as UTF-8, so it can be sent nowhere."""
    if text.isascii():
        return text, 0
    return _SURROGATE.subn("\ufffd", text)


def surrogate_note(count: int, where: str = "the prompt") -> str:
    """The one line that says what :func:`replace_lone_surrogates` did."""
    noun, verb = ("character", "was") if count == 1 else ("characters", "were")
    return (
        f"{count} {noun} in {where} could not be encoded (lone surrogates, e.g. from a file name "
        f"that is not UTF-8) and {verb} replaced with �."
    )


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the function calling this one name the
    first line outside dispatch_nb: the user's call, however many of the library's frames lie
    between (sync or async entry point, a session, a magic; the ``with`` of its context
    managers too)."""
    frame = inspect.currentframe()
    level = 0
    frame = frame.f_back if frame is not None else None  # the function that will warn: level 1
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename == contextlib.__file__):
        level += 1
        frame = frame.f_back
    return level + 1


def clean_text(text: str, where: str) -> str:
    """``text`` without lone surrogates; warns once (one line, naming the caller's line) when
    it replaced any."""
    cleaned, count = replace_lone_surrogates(text)
    if count:
        warnings.warn(surrogate_note(count, where), UnicodeWarning,
                      stacklevel=caller_stacklevel())
    return cleaned


def clean_messages(messages: Any) -> Any:
    """``messages`` (as ``chat`` accepts them) with lone surrogates in their text replaced (one
    warning says how many); returned unchanged when there are none."""
    from .types import Message, TextBlock

    if isinstance(messages, str):
        return clean_text(messages, "the message")
    if isinstance(messages, TextBlock):  # a block of a Message's content
        text = clean_text(messages.text, "the message")
        return messages if text is messages.text else messages.model_copy(update={"text": text})
    if isinstance(messages, Message):
        content = messages.content
        cleaned = clean_messages(content)
        if cleaned is content or (isinstance(content, list) and all(map(operator.is_, cleaned, content))):
            return messages
        return messages.model_copy(update={"content": cleaned})
    if isinstance(messages, (list, tuple)):
        return [clean_messages(m) for m in messages]
    return messages


def check_entry(
    messages: Any,
    *,
    system: Any,
    timeout: Any,
    cancel: Any,
    stream: Any = False,
) -> tuple[Any, str | None]:
    """What ``chat`` / ``stream`` / ``achat`` / ``astream`` check before anything is sent, but
    what a request checks when it is made (``max_tokens``, ``temperature``: ``Adapter._request``);
    returns ``(messages, system)`` with lone surrogates replaced."""
    from .cancel import CancelToken

    check_messages(messages)
    check_call(system=system, timeout=timeout, stream=stream)
    if cancel is not None and not isinstance(cancel, CancelToken):
        raise TypeError(f"cancel must be a CancelToken or None — not {describe(cancel)}")
    if system is not None:
        system = clean_text(system, "the system prompt")
    return clean_messages(messages), system
