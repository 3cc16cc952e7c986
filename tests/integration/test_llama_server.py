"""The ``compatible`` backend against a real peer: llama-cpp-python's OpenAI-compatible server with
the SmolLM2-135M GGUF, started on 127.0.0.1 for this module and stopped after it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from dispatch_nb import Message, StructuredOutput, ToolResultBlock, connect
from dispatch_nb.adapter import Adapter

from ..fakes.provider import WEATHER
from .llama_server import LlamaServer, llama_server_unavailable

pytestmark = pytest.mark.llama

FAST = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    reason = llama_server_unavailable()
    if reason:
        pytest.skip(reason)
    with LlamaServer() as server:
        yield server


@pytest.fixture
def llama(llama_server: LlamaServer) -> Iterator[Adapter]:
    adapter = connect("compatible:smollm2", base_url=llama_server.base_url, max_retries=0,
                      timeout=120)
    yield adapter
    adapter.close()


def test_plain_streaming(llama: Adapter) -> None:
    with llama.stream("Say hello in one short sentence.", system="You are friendly.",
                      **FAST) as stream:
        deltas = list(stream)
    response = stream.response
    assert deltas and all(d.type == "text_delta" for d in deltas)
    assert "".join(d.text or "" for d in deltas) == response.text
    assert response.text.strip()
    assert response.stop_reason in ("end_turn", "max_tokens")
    assert response.tool_calls == []
    # llama-cpp-python sends no usage in streams (PROTOCOLS.md §7.6), even though we ask for it:
    # the usage is then zero, never invented. A server that does send it must be mapped right.
    usage = response.usage
    if usage.output_tokens == 0:
        assert (usage.input_tokens, usage.cache_read_tokens) == (0, 0)
    else:
        assert usage.input_tokens > 0 and usage.output_tokens <= FAST["max_tokens"]


def test_non_streamed_answer_reports_usage(llama: Adapter) -> None:
    response = llama.chat("Name one colour.", **FAST)
    assert response.text.strip()
    assert response.usage.input_tokens > 0
    assert 0 < response.usage.output_tokens <= FAST["max_tokens"]
    assert response.model == "smollm2"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_forced_tool_call_and_tool_result_turn(llama: Adapter, stream: bool) -> None:
    history = [Message(role="user", content="What is the weather in Paris?")]
    first = llama.chat(history, system="You can call functions.", tools=[WEATHER],
                       tool_choice="get_weather", stream=stream, temperature=0.0, max_tokens=48)
    assert first.stop_reason == "tool_use"
    assert len(first.tool_calls) == 1
    call = first.tool_calls[0]
    assert call.name == "get_weather"
    assert call.arguments_error is None, call.raw_arguments
    assert isinstance(call.arguments.get("city"), str)
    assert call.id

    # The tool-result turn: the assistant's tool call goes back with content "" and the result as
    # a role "tool" message; the server accepts it and answers in text.
    history += [first.to_message(),
                Message(role="user", content=[ToolResultBlock(tool_use_id=call.id,
                                                              content="18 °C and sunny")])]
    second = llama.chat(history, system="You can call functions.", tools=[WEATHER],
                        stream=stream, **FAST)
    assert second.tool_calls == []
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.text.strip()


def test_forced_tool_call_streams_tool_deltas(llama: Adapter) -> None:
    with llama.stream("Weather in Oslo?", tools=[WEATHER], tool_choice="get_weather",
                      temperature=0.0, max_tokens=48) as stream:
        kinds = [d.type for d in stream]
    assert kinds[0] == "tool_use_start" and kinds[-1] == "tool_use_end"
    assert kinds.count("tool_use_start") == 1  # llama-cpp-python repeats the id on every chunk
    assert "tool_use_delta" in kinds
    assert stream.response.tool_calls[0].arguments_error is None


def test_async_stream(llama: Adapter) -> None:
    async def main() -> str:
        parts: list[str] = []
        async with llama.astream("Count: one, two,", **FAST) as stream:
            async for delta in stream:
                parts.append(delta.text or "")
        assert stream.response.text == "".join(parts)
        return stream.response.text

    assert asyncio.run(main()).strip()


def test_list_models_and_validate(llama: Adapter) -> None:
    assert [m.id for m in llama.list_models()] == ["smollm2"]
    check = llama.validate()
    assert check.ok, check.reason


# -- structured output ------------------------------------------------------------------------------
class Food(BaseModel):
    name: str
    kind: Literal["fruit", "vegetable", "grain", "dairy"]


class Foods(BaseModel):
    items: list[Food] = Field(min_length=1, max_length=3)  # bounded: a tiny model repeats itself


FOODS_PROMPT = "Extract the foods from: 'For dinner we had bread, tomatoes and a banana.'"


def test_structured_output_nested_schema_is_valid(
    llama_server: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    # response_format json_schema is refused by llama-cpp-python's server (a 500 holding a
    # validation error: its type must be text or json_object); the adapter switches to
    # {"type": "json_object", "schema": ...} once and the server's grammar constrains the answer.
    caplog.set_level("INFO", logger="dispatch_nb")
    adapter = connect("compatible:smollm2", base_url=llama_server.base_url, max_retries=0,
                      timeout=120)
    try:
        for stream in (False, True):
            response = adapter.chat(FOODS_PROMPT, output=Foods, stream=stream, temperature=0.0,
                                    max_tokens=160)
            assert isinstance(response.parsed, Foods)
            assert 1 <= len(response.parsed.items) <= 3
            jsonschema.validate(json.loads(response.text), StructuredOutput(Foods).schema)
    finally:
        adapter.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("rejected response_format json_schema" in m for m in messages) == 1
    assert sum("output=json_object" in m and "status=ok" in m for m in messages) == 2


def test_structured_output_as_a_forced_tool(llama_server: LlamaServer) -> None:
    adapter = connect("compatible:smollm2", base_url=llama_server.base_url, max_retries=0,
                      timeout=120, structured_output="tool")
    try:
        with adapter.stream(FOODS_PROMPT, output=Foods, temperature=0.0, max_tokens=160) as stream:
            kinds = {d.type for d in stream}
        response = stream.response
    finally:
        adapter.close()
    assert kinds == {"text_delta"}  # the output tool's arguments arrive as the answer's text
    assert isinstance(response.parsed, Foods) and response.tool_calls == []
    jsonschema.validate(json.loads(response.text), StructuredOutput(Foods).schema)
