"""The chat.completions path (``backend="compatible"``) against real loopback servers: the quirky
fake in each of its modes, and raw SSE streams for what a scripted Turn cannot produce."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch_nb import (
    APIConnectionError,
    ContextLengthError,
    ImageBlock,
    Message,
    RequestError,
    ServerError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from dispatch_nb.adapter import ChatRequest
from dispatch_nb.providers.openai import OpenAIAdapter
from dispatch_nb.sse import SSEDecoder
from dispatch_nb.stream import Accumulator
from dispatch_nb.wire.chat_completions import (
    ChatCompletionsWire,
    ChatQuirks,
    ChatStreamParser,
    chat_messages,
    chat_usage,
)

from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.provider import WEATHER, Fail, ToolCall, Turn, sse_event
from ..fakes.server import LoopbackServer, RecordedRequest, Reply

TWO_CALLS = [ToolCall("call_a", "get_weather", {"city": "Paris"}),
             ToolCall("call_b", "get_weather", {"city": "Oslo"})]


def adapter_for(fake: OpenAIChatFake | LoopbackServer, **kw: Any) -> OpenAIAdapter:
    base = fake.base_url if isinstance(fake, OpenAIChatFake) else fake.url + "/v1"
    kw.setdefault("max_retries", 0)
    return OpenAIAdapter("smollm2", backend="compatible", base_url=base, **kw)


@pytest.fixture
def llama() -> Iterator[OpenAIChatFake]:
    with OpenAIChatFake.llama() as f:
        yield f


def raw_server(*frames: bytes | dict[str, Any] | str) -> LoopbackServer:
    """A server answering every request with exactly these SSE frames."""
    events = [f if isinstance(f, bytes) else sse_event(f) for f in frames]
    return LoopbackServer(lambda request: Reply.sse(events))


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, index: int = 0,
          **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None and finish is None else [
        {"index": index, "delta": delta or {}, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
            "choices": choices, **extra}


# -- tool-call assembly quirks -------------------------------------------------------------------
@pytest.mark.parametrize(
    "quirks",
    [
        {},
        {"repeat_ids": True},
        {"reuse_index": True},
        {"split_choices": True},
        {"stop_with_tools": True},
        {"repeat_ids": True, "reuse_index": True, "pings": True, "usage": "finish"},
    ],
    ids=["openai", "llama-repeated-ids", "copilot-reused-index", "split-choices",
         "stop-with-tools", "everything"],
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_tool_calls_survive_every_quirk(quirks: dict[str, Any], stream: bool) -> None:
    with OpenAIChatFake(**quirks) as fake:
        fake.push(Turn(text="Checking both.", tool_calls=TWO_CALLS))
        response = adapter_for(fake).chat("Paris and Oslo?", tools=[WEATHER], stream=stream)
    assert response.stop_reason == "tool_use"
    assert response.text == "Checking both."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_a", "get_weather", {"city": "Paris"}),
        ("call_b", "get_weather", {"city": "Oslo"}),
    ]
    assert [b.type for b in response.content] == ["text", "tool_use", "tool_use"]


def test_llama_repeated_ids_stream_deltas() -> None:
    with OpenAIChatFake.llama() as fake:
        fake.push(Turn(tool_calls=[TWO_CALLS[0]]))
        with adapter_for(fake).stream("x", tools=[WEATHER]) as stream:
            deltas = list(stream)
    starts = [d for d in deltas if d.type == "tool_use_start"]
    ends = [d for d in deltas if d.type == "tool_use_end"]
    assert [(d.tool_call_id, d.tool_name) for d in starts] == [("call_a", "get_weather")]
    assert [d.arguments for d in ends] == [{"city": "Paris"}]
    args = "".join(d.argument_delta or "" for d in deltas if d.type == "tool_use_delta")
    assert args == '{"city": "Paris"}'


def test_legacy_function_call_delta_and_llama_duplicate() -> None:
    # llama-cpp-python sends function_call AND tool_calls in one delta: count the call once.
    both = {"function_call": {"name": "get_weather", "arguments": '{"city":'},
            "tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":'}}]}
    more = {"function_call": {"name": "get_weather", "arguments": '"Rome"}'},
            "tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                            "function": {"name": "get_weather", "arguments": '"Rome"}'}}]}
    with raw_server(chunk({"role": "assistant", "content": None, "tool_calls": None}),
                    chunk(both), chunk(more), chunk({}, "tool_calls"), "[DONE]") as server:
        response = adapter_for(server).chat("x", tools=[WEATHER], stream=True)
    assert [(c.id, c.arguments) for c in response.tool_calls] == [("call_x", {"city": "Rome"})]

    # An old server that only knows function_call still produces a tool call.
    legacy = [chunk({"function_call": {"name": "get_weather", "arguments": ""}}),
              chunk({"function_call": {"arguments": '{"city": "Lyon"}'}}),
              chunk({}, "function_call"), "[DONE]"]
    with raw_server(*legacy) as server:
        response = adapter_for(server).chat("x", tools=[WEATHER], stream=True)
    assert response.stop_reason == "tool_use"
    assert [(c.name, c.arguments) for c in response.tool_calls] == [
        ("get_weather", {"city": "Lyon"})]
    assert response.tool_calls[0].id  # generated when the server sends none


def test_malformed_tool_arguments_become_an_error_on_the_call(llama: OpenAIChatFake) -> None:
    llama.push(Turn(tool_calls=[ToolCall("call_bad", "get_weather", '{"city": "Par')]),
               Turn(text="Sorry."))
    adapter = adapter_for(llama)
    first = adapter.chat("x", tools=[WEATHER], stream=True)
    call = first.tool_calls[0]
    assert call.arguments == {}
    assert call.raw_arguments == '{"city": "Par'
    assert call.arguments_error and "not valid JSON" in call.arguments_error
    # Sent back verbatim next turn, with an error result: the strict server accepts it.
    history = [Message(role="user", content="x"), first.to_message(),
               Message(role="user", content=[ToolResultBlock(tool_use_id="call_bad",
                                                             content="bad JSON", is_error=True)])]
    assert adapter.chat(history, tools=[WEATHER]).text == "Sorry."
    sent = llama.last_request.json["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'
    assert sent[2] == {"role": "tool", "tool_call_id": "call_bad", "content": "Error: bad JSON"}


# -- stream framing ------------------------------------------------------------------------------
def test_pings_empty_choices_usage_on_any_chunk_and_no_done() -> None:
    frames = [
        b": ping\n\n",
        {"choices": [], "created": 0, "id": "", "prompt_filter_results": []},  # Azure first chunk
        {"choices": None, "copilot_references": []},
        chunk({"role": "assistant", "content": "Hel"}),
        b": ping - 2026-01-01\n\n",
        chunk({"content": "lo"}, "stop", usage={"prompt_tokens": 9, "completion_tokens": 2,
                                               "prompt_tokens_details": {"cached_tokens": 4}}),
    ]  # no [DONE]: the finish_reason already ended the answer
    with raw_server(*frames) as server:
        response = adapter_for(server).chat("x", stream=True)
    assert response.text == "Hello"
    assert response.stop_reason == "end_turn"
    assert (response.usage.input_tokens, response.usage.cache_read_tokens,
            response.usage.output_tokens) == (5, 4, 2)


def test_stream_cut_before_any_finish_is_a_connection_error() -> None:
    with raw_server(chunk({"content": "partial"})) as server, \
            pytest.raises(APIConnectionError) as info:
        adapter_for(server).chat("x", stream=True)
    assert info.value.code == "network_error"
    assert info.value.partial is not None and info.value.partial.text == "partial"


@pytest.mark.parametrize("usage", ["separate", "finish", "none"])
def test_usage_positions(usage: str) -> None:
    with OpenAIChatFake(usage=usage) as fake:
        fake.push(Turn(text="hi", input_tokens=30, cache_read_tokens=10, output_tokens=5))
        response = adapter_for(fake).chat("x", stream=True)
        body = fake.last_request.json
    assert body["stream_options"] == {"include_usage": True}
    expected = (0, 0, 0) if usage == "none" else (30, 10, 5)
    assert (response.usage.input_tokens, response.usage.cache_read_tokens,
            response.usage.output_tokens) == expected


def test_stream_options_only_when_streaming() -> None:
    with OpenAIChatFake() as fake:  # the fake rejects stream_options without stream, like OpenAI
        assert adapter_for(fake).chat("x").text == "echo: x"
        assert "stream_options" not in fake.last_request.json


def test_usage_mapping_excludes_cached_and_written_tokens() -> None:
    usage = chat_usage({"prompt_tokens": 100, "completion_tokens": 7,
                        "prompt_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 25}})
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_creation_tokens,
            usage.output_tokens) == (15, 60, 25, 7)


# -- errors ----------------------------------------------------------------------------------------
def test_llama_error_bodies(llama: OpenAIChatFake) -> None:
    llama.push(Fail(400, "the request exceeds the available context size",
                    "exceed_context_size_error"),
               Fail(503, "Loading model", "unavailable_error"))
    adapter = adapter_for(llama)
    with pytest.raises(ContextLengthError) as info:
        adapter.chat("x")
    assert info.value.status_code == 400
    with pytest.raises(ServerError) as info2:
        adapter.chat("x")
    assert info2.value.status_code == 503 and info2.value.retryable


def test_in_stream_error_after_200_keeps_partial(llama: OpenAIChatFake) -> None:
    llama.push(Turn(text="abcdef", chunk=2, error_after=2,
                    error=Fail(400, "context full", "exceed_context_size_error")))
    with pytest.raises(ContextLengthError) as info:
        adapter_for(llama).chat("x", stream=True)
    assert info.value.status_code == 400
    assert info.value.partial is not None and info.value.partial.text == "abcd"


# -- reasoning -------------------------------------------------------------------------------------
def test_reasoning_content_becomes_thinking_and_is_not_echoed(llama: OpenAIChatFake) -> None:
    llama.push(Turn(thinking="Let me think.", text="42."), Turn(text="ok"))
    adapter = adapter_for(llama)
    first = adapter.chat("x", stream=True)
    assert first.thinking == "Let me think."
    assert isinstance(first.content[0], ThinkingBlock) and first.content[0].signature is None
    assert first.text == "42."
    adapter.chat([Message(role="user", content="x"), first.to_message(),
                  Message(role="user", content="and?")])
    assistant = llama.last_request.json["messages"][1]
    assert assistant == {"role": "assistant", "content": "42."}


def test_copilot_reasoning_text_and_opaque_round_trip() -> None:
    """The hooks the Copilot adapter reuses: reasoning_text/reasoning_opaque in, echoed back out."""
    acc = Accumulator("m")
    parser = ChatStreamParser(acc, provider="copilot")
    stream = b"".join([
        sse_event(chunk({"role": "assistant", "reasoning_text": "Think "})),
        sse_event(chunk({"reasoning_text": "hard."})),
        sse_event(chunk({"reasoning_opaque": "OPAQUE=="})),
        sse_event(chunk({"content": "Done."}, "stop")),
        b"data: [DONE]\n\n",
    ])
    deltas = [d for event in SSEDecoder().feed(stream) for d in parser.feed(event)]
    assert parser.complete
    assert [d.type for d in deltas] == ["thinking_delta", "thinking_delta", "text_delta"]
    response = acc.finish()
    thinking = response.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == ("Think hard.", "OPAQUE==")

    history = [Message(role="user", content="q"),
               Message.model_validate_json(response.to_message().model_dump_json())]
    echoed = chat_messages(history, echo_reasoning=True)[1]
    assert echoed == {"role": "assistant", "content": "Done.", "reasoning_text": "Think hard.",
                      "reasoning_opaque": "OPAQUE=="}
    assert "reasoning_opaque" not in chat_messages(history)[1]
    # Foreign thinking (another provider's signed block) is never echoed.
    foreign = Message(role="assistant", content=[ThinkingBlock(thinking="t", signature="ant"),
                                                 TextBlock(text="a")])
    assert chat_messages([foreign], echo_reasoning=True) == [{"role": "assistant",
                                                               "content": "a"}]


def test_copilot_flavoured_fake_round_trips_opaque() -> None:
    with OpenAIChatFake(prefix="", reasoning_field="reasoning_text",
                        signature_field="reasoning_opaque", usage="finish") as fake:
        fake.push(Turn(thinking="hmm", signature="SIG", text="hi"))
        response = adapter_for_prefixless(fake).chat("x", stream=True)
        assert fake.last_request.path == "/chat/completions"
    block = response.content[0]
    assert isinstance(block, ThinkingBlock) and block.signature == "SIG"
    body = ChatCompletionsWire("copilot", ChatQuirks(echo_reasoning=True)).build_body(
        ChatRequest(messages=[Message(role="user", content="x"), response.to_message(),
                              Message(role="user", content="y")]),
        "claude")
    assert body["messages"][1]["reasoning_opaque"] == "SIG"


def adapter_for_prefixless(fake: OpenAIChatFake) -> OpenAIAdapter:
    return OpenAIAdapter("claude", backend="compatible", base_url=fake.base_url, max_retries=0)


def test_refusal_is_text_with_stop_reason_refusal() -> None:
    with OpenAIChatFake() as fake:
        fake.push(Turn(text="I can't help with that.", stop_reason="refusal"),
                  Turn(text="I can't help with that.", stop_reason="refusal"))
        streamed = adapter_for(fake).chat("x", stream=True)
        plain = adapter_for(fake).chat("x")
    for response in (streamed, plain):
        assert response.text == "I can't help with that."
        assert response.stop_reason == "refusal"


@pytest.mark.parametrize(("stop", "expected"), [("max_tokens", "max_tokens"),
                                                ("content_filter", "content_filter")])
def test_finish_reasons(stop: str, expected: str) -> None:
    with OpenAIChatFake() as fake:
        fake.push(Turn(text="cut", stop_reason=stop))
        assert adapter_for(fake).chat("x", stream=True).stop_reason == expected


# -- request building ------------------------------------------------------------------------------
def test_request_shape_against_strict_server(llama: OpenAIChatFake) -> None:
    llama.push(Turn(text="Checking.", tool_calls=TWO_CALLS), Turn(text="Done."))
    adapter = adapter_for(llama, max_tokens=64)
    history = [Message(role="user", content="Weather?")]
    first = adapter.chat(history, system="Be brief.", tools=[WEATHER])
    history += [
        first.to_message(),
        Message(role="user", content=[
            TextBlock(text="Here you go."),  # text before the results: still sent after them
            ToolResultBlock(tool_use_id="call_a", content="18 °C"),
            ToolResultBlock(tool_use_id="call_b", content=[TextBlock(text="4 °C")]),
        ]),
    ]
    adapter.chat(history, system="Be brief.", tools=[WEATHER], stream=True)
    body = llama.last_request.json
    assert body["max_tokens"] == 64
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": WEATHER.parameters}}]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "tool",
                                                     "user"]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assistant = body["messages"][2]
    assert assistant["content"] == "Checking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_a", "call_b"]
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather",
                                                      "arguments": '{"city":"Paris"}'}
    assert body["messages"][4]["content"] == "4 °C"
    assert body["messages"][5] == {"role": "user", "content": "Here you go."}


def test_tool_only_assistant_turn_has_empty_string_content(llama: OpenAIChatFake) -> None:
    llama.push(Turn(tool_calls=[TWO_CALLS[0]]), Turn(text="ok"))
    adapter = adapter_for(llama)
    first = adapter.chat("x", tools=[WEATHER], stream=True)
    adapter.chat([Message(role="user", content="x"), first.to_message(),
                  Message(role="user", content=[ToolResultBlock(tool_use_id="call_a",
                                                                content="r")])],
                 tools=[WEATHER])
    assistant = llama.last_request.json["messages"][1]
    assert assistant["content"] == ""


def test_consecutive_same_role_messages_are_merged(llama: OpenAIChatFake) -> None:
    history = [
        Message(role="user", content="one"),
        Message(role="user", content="two"),
        Message(role="assistant", content="a"),
        Message(role="assistant", content=[TextBlock(text="b")]),
        Message(role="user", content="three"),
    ]
    adapter_for(llama).chat(history)  # the strict server rejects non-alternating roles
    assert llama.last_request.json["messages"] == [
        {"role": "user", "content": "one\n\ntwo"},
        {"role": "assistant", "content": "a\n\nb"},
        {"role": "user", "content": "three"},
    ]


def test_images_become_image_url_parts() -> None:
    with OpenAIChatFake() as fake:
        adapter_for(fake).chat([Message(role="user", content=[
            TextBlock(text="What is this?"),
            ImageBlock(source="aGVsbG8=", media_type="image/png"),
            ImageBlock(source="https://example.com/cat.jpg"),
        ])])
        content = fake.last_request.json["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]


def test_builtin_tools_are_refused_before_sending() -> None:
    with OpenAIChatFake() as fake:
        with pytest.raises(RequestError) as info:
            adapter_for(fake).chat("x", tools=[WEATHER, {"type": "web_search"}])
        assert info.value.code == "invalid_request"
        assert fake.chat_requests == []
    assert "web_search" in info.value.message and "official" in info.value.message


def test_tool_choice_and_options_map_to_the_wire() -> None:
    with OpenAIChatFake() as fake:
        adapter = adapter_for(fake)
        adapter.chat("x", tools=[WEATHER], tool_choice="get_weather", stop=["\n\n"], top_p=0.5,
                     parallel_tool_calls=False, reasoning="low", temperature=0.2,
                     response_format={"type": "json_object"})
        body = fake.last_request.json
        assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        assert (body["stop"], body["top_p"], body["parallel_tool_calls"], body["temperature"]) == (
            ["\n\n"], 0.5, False, 0.2)
        assert body["reasoning_effort"] == "low"
        assert body["response_format"] == {"type": "json_object"}
        adapter.chat("x", tools=[WEATHER], tool_choice="required")
        assert fake.last_request.json["tool_choice"] == "required"
        adapter.chat("x", tool_choice="auto")  # no tools: nothing to choose, nothing sent
        assert "tool_choice" not in fake.last_request.json
        count = len(fake.chat_requests)
        with pytest.raises(RequestError) as info:
            adapter.chat("x", tools=[WEATHER], tool_choice="get_time")
        assert info.value.code == "invalid_request"
        with pytest.raises(RequestError) as info:
            adapter.chat("x", tool_choice="required")
        assert info.value.code == "invalid_request"
        with pytest.raises(TypeError):
            adapter.chat("x", text={"verbosity": "low"})  # a Responses-only option
        assert len(fake.chat_requests) == count


# -- models, auth, async ---------------------------------------------------------------------------
def test_list_models_and_validate(llama: OpenAIChatFake) -> None:
    adapter = adapter_for(llama)
    models = adapter.list_models()
    assert [m.id for m in models] == ["smollm2"]
    assert models[0].vendor == "me"
    check = adapter.validate()
    assert check and check.ok
    assert asyncio.run(adapter.alist_models())[0].id == "smollm2"
    llama.close()
    check = adapter.validate()
    assert not check and check.reason


def test_api_key_is_optional_and_sent_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIChatFake() as fake:
        adapter_for(fake).chat("x")
        assert fake.last_request.header("authorization") is None
        adapter_for(fake, api_key="local-key").chat("x")
        assert fake.last_request.header("authorization") == "Bearer local-key"
    with OpenAIChatFake(api_key="right") as fake:
        from dispatch_nb import AuthenticationError

        with pytest.raises(AuthenticationError) as info:
            adapter_for(fake, api_key="wrong").chat("x")
        assert (info.value.status_code, info.value.code) == (401, "authentication_failed")


def test_async_quirky_stream() -> None:
    async def main(fake: OpenAIChatFake) -> tuple[list[str], Any]:
        adapter = adapter_for(fake)
        kinds: list[str] = []
        async with adapter.astream("x", tools=[WEATHER]) as stream:
            async for delta in stream:
                kinds.append(delta.type)
        return kinds, stream.response

    with OpenAIChatFake(reuse_index=True, split_choices=True, pings=True, usage="finish") as fake:
        fake.push(Turn(text="t", tool_calls=TWO_CALLS))
        kinds, response = asyncio.run(main(fake))
    assert kinds.count("tool_use_start") == kinds.count("tool_use_end") == 2
    assert [c.arguments["city"] for c in response.tool_calls] == ["Paris", "Oslo"]
    assert isinstance(response.content[1], ToolUseBlock)


def test_fake_rejects_what_real_servers_reject(llama: OpenAIChatFake) -> None:
    adapter = adapter_for(llama)
    orphan = [Message(role="user", content=[ToolResultBlock(tool_use_id="nope", content="r")])]
    with pytest.raises(RequestError) as info:
        adapter.chat(orphan)
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")
    assert "tool" in info.value.message
    unanswered = [Message(role="user", content="x"),
                  Message(role="assistant", content=[ToolUseBlock(id="c1", name="get_weather")]),
                  Message(role="user", content="next")]
    with pytest.raises(RequestError) as raised:
        adapter.chat(unanswered, tools=[WEATHER])
    assert (raised.value.status_code, raised.value.code) == (400, "invalid_request")


def test_recorded_request_helper_types() -> None:
    # The inspector helpers read what was really sent.
    with OpenAIChatFake() as fake:
        adapter_for(fake, max_tokens=33).chat("hello", system="sys", tools=[WEATHER])
        request: RecordedRequest = fake.last_request
        assert fake.system_of(request) == "sys"
        assert fake.max_tokens_of(request) == 33
        assert fake.tool_names_of(request) == ["get_weather"]
        assert fake.last_user_text(request) == "hello"


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c", "type": "function",
                          "function": {"name": "f", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "c", "content": "r"}], "must not be null"),
        ([{"role": "user", "content": "x"}, {"role": "system", "content": "late"}],
         "beginning"),
        ([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}], "alternate"),
        ([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "zz",
                                             "content": "r"}], "tool_call_id 'zz'"),
    ],
    ids=["null-content", "system-not-first", "roles-not-alternating", "unknown-tool-call-id"],
)
def test_strict_fake_rejects_raw_bodies(llama: OpenAIChatFake, messages: list[Any],
                                        expected: str) -> None:
    import httpx

    reply = httpx.post(llama.base_url + "/chat/completions",
                       json={"model": "smollm2", "messages": messages})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == 400  # llama.cpp's error body shape
    assert expected in reply.json()["error"]["message"]


# -- CRLF, n, thinking not echoed ----------------------------------------------------------------
def test_thinking_from_reasoning_fields_still_goes_back_as_a_string() -> None:
    """Only thinking that came as content parts is sent back as parts: a DeepSeek-style
    ``reasoning_content`` answer keeps plain-string assistant content (never echoed)."""
    with OpenAIChatFake() as fake:
        fake.push(Turn(thinking="hidden", text="shown"))
        first = adapter_for(fake).chat("x", stream=True)
        adapter_for(fake).chat([Message("user", "x"), first.to_message(), Message("user", "y")])
        assert fake.last_request.json["messages"][1] == {"role": "assistant", "content": "shown"}


@pytest.mark.parametrize("mode", ["stream", "async"])
def test_crlf_line_endings(mode: str) -> None:
    turn = Turn(thinking="Think.", text="Line one.\nLine two.", chunk=3, tool_calls=TWO_CALLS)
    with OpenAIChatFake(crlf=True) as fake:
        fake.push(turn, turn)
        adapter = adapter_for(fake)
        plain = adapter.chat("x", tools=[WEATHER])
        if mode == "async":
            streamed = asyncio.run(adapter.achat("x", tools=[WEATHER], stream=True))
        else:
            streamed = adapter.chat("x", tools=[WEATHER], stream=True)
    assert streamed.model_dump() == plain.model_dump()
    assert streamed.text == "Line one.\nLine two."
    assert [c.arguments["city"] for c in streamed.tool_calls] == ["Paris", "Oslo"]


def test_several_choices_are_refused_before_sending() -> None:
    with OpenAIChatFake() as fake:
        with pytest.raises(RequestError) as info:
            adapter_for(fake).chat("x", extra_body={"n": 3})
        assert info.value.code == "invalid_request"
        assert "n=3" in info.value.message and "separate calls" in info.value.message
        assert fake.chat_requests == []
        adapter_for(fake).chat("x", extra_body={"n": 1})
        assert fake.last_request.json["n"] == 1


# -- a server quirk learnt by an adapter that threads share ------------------------------------------
class _TwoAtOnce(OpenAIChatFake):
    """llama-cpp-python's server, answering the first two ``json_schema`` requests together: the
    second one's refusal arrives only after the first thread has resent its request."""

    def _dispatch(self, request: RecordedRequest) -> Reply:
        if request.method == "POST":
            kind = (request.json.get("response_format") or {}).get("type")
            if kind == "json_schema":
                with self.lock:
                    n, self.schema_requests = self.schema_requests, self.schema_requests + 1
                if n < 2:
                    self.barrier.wait(timeout=20)
                    if n == 1:
                        self.resent.wait(timeout=20)
            elif kind == "json_object":
                self.resent.set()
        return super()._dispatch(request)


def test_the_json_object_fallback_holds_for_every_thread_sharing_the_adapter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two threads' json_schema requests are both refused; each resends its own as json_object,
    though the other thread learnt the quirk first (the wire format the adapter was made with
    stays as it was)."""
    import threading

    from pydantic import BaseModel

    class City(BaseModel):
        name: str

    fake = _TwoAtOnce.llama()
    fake.lock, fake.schema_requests = threading.Lock(), 0
    fake.barrier, fake.resent = threading.Barrier(2), threading.Event()
    with fake:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=fake.base_url,
                                max_retries=0)
        made_with = adapter.wire
        results: dict[int, Any] = {}

        def ask(i: int) -> None:
            try:
                results[i] = adapter.chat(f"city {i}", output=City).parsed
            except Exception as exc:  # kept for the assertion below
                results[i] = exc

        with caplog.at_level("WARNING", logger="dispatch_nb"):
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        assert all(isinstance(results[i], City) for i in range(2)), results
        kinds = [r.json["response_format"]["type"] for r in fake.chat_requests]
        assert sorted(kinds) == ["json_object", "json_object", "json_schema", "json_schema"]
        assert adapter.wire is made_with  # fixed at construction
        assert isinstance(adapter.chat("one more", output=City).parsed, City)  # learnt once
        assert fake.last_request.json["response_format"]["type"] == "json_object"
        warned = [r for r in caplog.records if "rejected response_format" in r.getMessage()]
        assert len(warned) == 1
        adapter.close()
