"""Content as a list of parts on chat.completions (Mistral's reasoning models), against the Mistral
flavour of the chat.completions fake.

Kept apart from ``test_openai_chat.py``: the assistant turns these tests send back carry Mistral's
``thinking`` parts, which are Mistral's wire format and not in OpenAI's request schema (that file's
request bodies are validated against it by ``tests/contract/test_openai_schema.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch_nb import Message
from dispatch_nb.providers.openai import OpenAIAdapter
from dispatch_nb.stream import Accumulator
from dispatch_nb.wire.chat_completions import ChatStreamParser

from ..fakes.openai_chat import REFERENCE_PART, ChatTurn, OpenAIChatFake
from ..fakes.provider import Turn


def adapter_for(fake: OpenAIChatFake) -> OpenAIAdapter:
    return OpenAIAdapter("magistral-medium-latest", backend="compatible", base_url=fake.base_url,
                         max_retries=0)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


@pytest.mark.parametrize("mode", ["json", "stream", "async"])
def test_mistral_thinking_parts_become_thinking_and_go_back_as_parts(mode: str) -> None:
    thought = "Okay, the user asks how to cross the street safely."
    with OpenAIChatFake.mistral() as fake:
        fake.push(ChatTurn(thinking=thought, text="Look left, right, left again.", chunk=7,
                           parts=[REFERENCE_PART]),
                  Turn(text="Use a bridge."))
        adapter = adapter_for(fake)
        history = [Message("user", "How do I cross the street?")]
        if mode == "async":
            first = asyncio.run(adapter.achat(history, stream=True))
        else:
            first = adapter.chat(history, stream=mode == "stream")
        assert [b.type for b in first.content] == ["thinking", "text", "text"]
        assert first.thinking == thought
        assert first.text == "Look left, right, left again."
        # the part type dispatch_nb does not know is kept whole (streamed in pieces, merged)
        assert first.content[2].provider_data == {"openai_chat": {"part": REFERENCE_PART}}
        history += [first.to_message(), Message("user", "And a river?")]
        assert adapter.chat(history, stream=mode != "json").text == "Use a bridge."
        assert fake.last_request.json["messages"][1] == {"role": "assistant", "content": [
            {"type": "thinking", "thinking": [{"type": "text", "text": thought}]},
            {"type": "text", "text": "Look left, right, left again."},
            REFERENCE_PART,
        ]}



def test_unknown_parts_streamed_in_pieces_are_merged() -> None:
    acc = Accumulator()
    parser = ChatStreamParser(acc, provider="compatible")
    for piece in ({"type": "reference", "reference_ids": [0]},
                  {"type": "reference", "reference_ids": [2]},
                  {"type": "text", "text": "so"},
                  {"type": "reference", "reference_ids": [5]}):
        parser.feed_chunk(chunk({"content": [piece]}))
    parser.feed_chunk(chunk(finish="stop"))
    response = acc.finish()
    assert [(b.text, b.provider_data) for b in response.content] == [
        ("", {"openai_chat": {"part": {"type": "reference", "reference_ids": [0, 2]}}}),
        ("so", None),
        ("", {"openai_chat": {"part": {"type": "reference", "reference_ids": [5]}}}),
    ]
