"""A prompt that is empty or only whitespace is refused before anything is sent, for every
provider, as ``%%chat`` refuses an empty cell: Anthropic's API answers such a text block with a 400
("text content blocks must contain non-whitespace text"), the others with nonsense. Whitespace next
to something meaningful (an image, a tool result) is still a prompt, and is sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch_nb import (
    ImageBlock,
    Message,
    RequestError,
    Session,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

from ..fakes.provider import ProviderFake, Turn
from .targets import TARGETS, only

BLANKS = ["   ", " \n\t ", ""]
ANTHROPIC = [t for t in TARGETS if t.name == "anthropic"]


@pytest.mark.parametrize("blank", BLANKS, ids=["spaces", "newlines-and-tabs", "empty"])
def test_a_blank_prompt_is_refused_before_anything_is_sent(
    make: Any, fake: ProviderFake, blank: str
) -> None:
    adapter = make()
    calls = {
        "chat": lambda: adapter.chat(blank),
        "chat-stream": lambda: adapter.chat(blank, stream=True),
        "stream": lambda: adapter.stream(blank),
        "a-message-list": lambda: adapter.chat(
            [Message(role="user", content="Hi"), Message(role="assistant", content="Hello!"),
             Message(role="user", content=[TextBlock(text=blank), TextBlock(text=blank)])]),
        "achat": lambda: asyncio.run(adapter.achat(blank)),
        "astream": lambda: adapter.astream(blank),
    }
    for name, call in calls.items():
        with pytest.raises(RequestError) as info:
            call()
        assert info.value.code == "invalid_request", name
        assert "only whitespace" in info.value.message and "write what to ask" in str(info.value)
    session = Session(adapter)
    session_calls = {
        "send": lambda: session.send(blank or " "),
        "send-blocks": lambda: session.send([TextBlock(text=" "), {"type": "text", "text": "\n"}]),
        "asend": lambda: asyncio.run(session.asend(blank or "\n")),
        "stream": lambda: list(session.stream(blank or "\t")),
        "a-message": lambda: session.send(Message(role="user", content=blank or "  ")),
    }
    for name, call in session_calls.items():
        with pytest.raises(ValueError, match="only whitespace — write what to ask"):
            call()
        assert not session.history, name
    assert fake.chat_requests == []


@only(ANTHROPIC)
def test_whitespace_next_to_an_image_or_a_tool_result_is_sent(
    make: Any, fake: ProviderFake
) -> None:
    adapter = make()
    image = ImageBlock(source="https://example.org/cat.png")
    assert adapter.chat([Message(role="user", content=[TextBlock(text=" \n"), image])]).text
    sent = fake.last_request.json["messages"]
    assert [b["type"] for b in sent[-1]["content"]] == ["image"]  # the whitespace is left out

    fake.push(Turn(text="Sunny."))
    history = [
        Message(role="user", content="Weather in Oslo?"),
        Message(role="assistant", content=[ToolUseBlock(id="toolu_1", name="get_weather",
                                                        arguments={"city": "Oslo"})]),
        Message(role="user", content=[ToolResultBlock(tool_use_id="toolu_1", content="sunny"),
                                      TextBlock(text="  ")]),
    ]
    assert adapter.chat(history).text == "Sunny."
    sent = fake.last_request.json["messages"]
    assert [b["type"] for b in sent[-1]["content"]] == ["tool_result"]
