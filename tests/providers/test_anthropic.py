"""AnthropicAdapter against real loopback servers: the strict Messages API fake, and raw SSE streams
for the events a scripted Turn cannot produce (citations, server tools, odd stop reasons)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dispatch_nb import (
    APIConnectionError,
    AuthenticationError,
    ContextLengthError,
    ImageBlock,
    Message,
    ModelUnavailableError,
    RateLimitError,
    RedactedThinkingBlock,
    RequestError,
    ServerError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    connect,
)
from dispatch_nb.providers.anthropic import AnthropicAdapter

from ..fakes.anthropic import (
    COMPACTION,
    SERVER_TOOL_USE,
    WEB_SEARCH_RESULT,
    AnthropicFake,
    AnthropicTurn,
)
from ..fakes.provider import WEATHER, Fail, ToolCall, Turn, sse_event
from ..fakes.server import LoopbackServer, RecordedRequest, Reply

KEY = "sk-ant-test-SECRET-0123456789"
MODEL = "claude-sonnet-4-5"


@pytest.fixture
def fake() -> Iterator[AnthropicFake]:
    with AnthropicFake(api_key=KEY) as f:
        yield f


@pytest.fixture
def claude(fake: AnthropicFake) -> Iterator[AnthropicAdapter]:
    adapter = AnthropicAdapter(MODEL, api_key=KEY, base_url=fake.base_url, max_retries=0)
    yield adapter
    adapter.close()


class RawServer:
    """Answers each request with the next queued Reply; records what it got."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.server = LoopbackServer(self._handle)

    def _handle(self, request: RecordedRequest) -> Reply:
        if not self.replies:
            return Reply.json({"type": "error", "error": {"type": "api_error",
                                                          "message": "nothing queued"}}, 500)
        return self.replies.pop(0)

    def stream(self, *events: dict[str, Any]) -> RawServer:
        self.replies.append(Reply.sse([sse_event(e, event=e["type"]) for e in events]))
        return self

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.server.requests


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    with server.server:
        yield server


@pytest.fixture
def raw_claude(raw: RawServer) -> Iterator[AnthropicAdapter]:
    adapter = AnthropicAdapter(MODEL, api_key=KEY, base_url=raw.server.url, max_retries=0)
    yield adapter
    adapter.close()


def start(usage: dict[str, int] | None = None) -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "content": [], "model": MODEL,
        "stop_reason": None, "stop_sequence": None,
        "usage": usage or {"input_tokens": 25, "cache_creation_input_tokens": 0,
                           "cache_read_input_tokens": 0, "output_tokens": 1}}}


def block(index: int, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content}


def delta(index: int, content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": content}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(reason: str = "end_turn", usage: dict[str, int] | None = None,
        stop_sequence: str | None = None) -> list[dict[str, Any]]:
    return [{"type": "message_delta",
             "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
             "usage": usage or {"output_tokens": 9}},
            {"type": "message_stop"}]


PING = {"type": "ping"}


# -- the request -----------------------------------------------------------------------------------
def test_headers_and_required_fields(fake: AnthropicFake) -> None:
    adapter = AnthropicAdapter(MODEL, api_key=KEY, base_url=fake.base_url + "/v1",
                               betas=["interleaved-thinking-2025-05-14"], max_retries=0)
    adapter.chat("Hi", betas=["context-1m-2025-08-07"])
    sent = fake.last_request
    assert sent.path == "/v1/messages"
    assert sent.header("x-api-key") == KEY
    assert sent.header("anthropic-version") == "2023-06-01"
    assert sent.header("anthropic-beta") == "interleaved-thinking-2025-05-14,context-1m-2025-08-07"
    body = sent.json
    assert body["model"] == MODEL
    assert body["max_tokens"] == 4096
    assert "system" not in body
    assert "stream" not in body
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    adapter.close()


def test_options_on_the_wire(claude: AnthropicAdapter, fake: AnthropicFake) -> None:
    claude.chat("Hi", system="Be brief.", temperature=0.2, top_p=0.9, top_k=5, stop="END",
                max_tokens=3000, thinking={"type": "enabled", "budget_tokens": 2048},
                metadata={"user_id": "u1"}, stream=True)
    body = fake.last_request.json
    assert body["system"] == "Be brief."
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.2, 0.9, 5)
    assert body["stop_sequences"] == ["END"]
    assert body["max_tokens"] == 3000
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["metadata"] == {"user_id": "u1"}
    assert body["stream"] is True

    claude.chat("Hi", thinking=1500, stop_sequences=["A", "B"])
    body = fake.last_request.json
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1500}
    assert body["stop_sequences"] == ["A", "B"]
    with pytest.raises(TypeError, match="thinking"):
        claude.chat("Hi", thinking=True)
    with pytest.raises(TypeError, match="does not understand"):
        claude.chat("Hi", reasoning_effort="high")


def test_thinking_budget_must_fit_max_tokens(claude: AnthropicAdapter) -> None:
    # The strict fake rejects what the real API rejects; the 400 arrives as a RequestError.
    with pytest.raises(RequestError, match="budget_tokens") as info:
        claude.chat("Hi", max_tokens=2000, thinking=4000)
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ("get_weather", {"type": "tool", "name": "get_weather"}),
        ({"type": "function", "function": {"name": "get_weather"}},
         {"type": "tool", "name": "get_weather"}),
    ],
)
def test_tools_and_tool_choice(claude: AnthropicAdapter, fake: AnthropicFake, choice: Any,
                               wire: dict[str, Any]) -> None:
    web_search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    claude.chat("Hi", tools=[WEATHER, web_search], tool_choice=choice)
    body = fake.last_request.json
    assert body["tools"] == [
        {"name": "get_weather", "description": "Current weather for a city",
         "input_schema": WEATHER.parameters},
        web_search,
    ]
    assert body["tool_choice"] == wire


def test_messages_merged_ordered_and_converted(claude: AnthropicAdapter,
                                               fake: AnthropicFake) -> None:
    png = ImageBlock.from_bytes(b"\x89PNG fake", "image/png")
    fake.push(Turn(text="Checking.", tool_calls=[ToolCall("toolu_1", "get_weather",
                                                          {"city": "Oslo"})]),
              Turn(text="Done."))
    first = claude.chat([Message("user", "Look:"), Message("user", [png]),
                         Message("user", [ImageBlock(source="https://x.test/cat.jpg")])],
                        tools=[WEATHER])
    body = fake.last_request.json
    assert len(body["messages"]) == 1
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "Look:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": png.source}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.jpg"}},
    ]
    history = [
        Message("user", "Look:"),
        first.to_message(),
        Message("assistant", []),  # an empty turn is dropped, not sent
        Message("user", "and also this"),  # merged after the tool result, which goes first
        Message("user", [ToolResultBlock(tool_use_id="toolu_1", is_error=True,
                                         content=[TextBlock("no "), TextBlock("network")])]),
    ]
    claude.chat(history, tools=[WEATHER])
    messages = fake.last_request.json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
         "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "network"}]},
        {"type": "text", "text": "and also this"},
    ]
    assert messages[1]["content"][1] == {"type": "tool_use", "id": "toolu_1",
                                         "name": "get_weather", "input": {"city": "Oslo"}}


def test_cache_control_from_provider_data(claude: AnthropicAdapter, fake: AnthropicFake) -> None:
    doc = TextBlock("a long document",
                    provider_data={"anthropic": {"cache_control": {"type": "ephemeral"}}})
    claude.chat([Message("user", [doc, TextBlock("Summarize it.")])])
    content = fake.last_request.json["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "a long document",
                          "cache_control": {"type": "ephemeral"}}
    assert content[1] == {"type": "text", "text": "Summarize it."}


# -- credentials -----------------------------------------------------------------------------------
def test_missing_key_fails_at_call_time(fake: AnthropicFake,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    adapter = AnthropicAdapter(MODEL, base_url=fake.base_url, max_retries=0)  # no error yet
    with pytest.raises(AuthenticationError, match="ANTHROPIC_API_KEY") as info:
        adapter.chat("Hi")
    assert info.value.code == "authentication_failed"
    with pytest.raises(AuthenticationError, match="ANTHROPIC_API_KEY") as info:
        adapter.chat("Hi", stream=True)
    assert info.value.code == "authentication_failed"
    result = adapter.validate()
    assert not result and "ANTHROPIC_API_KEY" in result.reason
    assert fake.requests == []  # nothing was sent without a key
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)  # set later, e.g. in a notebook cell
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)  # ... for this server
    assert adapter.chat("Hi").text == "echo: Hi"
    adapter.close()


def test_an_environment_key_is_never_sent_to_another_host(
    fake: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ANTHROPIC_API_KEY is for Anthropic (or ANTHROPIC_BASE_URL): a server named only by
    base_url= never sees it; the error names the model and the URL."""
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    adapter = AnthropicAdapter(MODEL, base_url=fake.base_url, max_retries=0)
    with pytest.raises(AuthenticationError) as info:
        adapter.chat("Hi")
    message = info.value.message
    assert info.value.code == "authentication_failed"
    assert f"anthropic:{MODEL}" in message and fake.base_url in message
    assert "ANTHROPIC_API_KEY is for https://api.anthropic.com" in message and KEY not in message
    assert fake.requests == []
    # saying it for that server: api_key= with base_url=
    paired = AnthropicAdapter(MODEL, api_key=KEY, base_url=fake.base_url, max_retries=0)
    assert paired.chat("Hi").text == "echo: Hi"
    assert fake.last_request.header("x-api-key") == KEY
    adapter.close()
    paired.close()


def test_environment_configuration(fake: AnthropicFake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    adapter = connect(f"anthropic:{MODEL}", max_retries=0)
    assert isinstance(adapter, AnthropicAdapter)
    assert (adapter.provider_name, adapter.display_name, adapter.model_name) == (
        "anthropic", "Anthropic", MODEL)
    assert adapter.max_context_tokens == 200_000
    assert adapter.chat("Hello").text == "echo: Hello"
    adapter.close()


def test_key_never_leaks(fake: AnthropicFake, caplog: pytest.LogCaptureFixture) -> None:
    adapter = AnthropicAdapter(MODEL, api_key=KEY + "-wrong", base_url=fake.base_url,
                               max_retries=0)
    with caplog.at_level(logging.DEBUG, logger="dispatch_nb"), \
            pytest.raises(AuthenticationError) as info:
        adapter.chat("Hi")
    err = info.value
    assert err.status_code == 401
    for text in (repr(adapter), str(adapter), str(err), repr(err), caplog.text,
                 str(adapter.validate())):
        assert "SECRET" not in text
    adapter.close()


def test_auth_from_custom_headers(fake: AnthropicFake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    adapter = AnthropicAdapter(MODEL, base_url=fake.base_url, headers={"X-Api-Key": KEY},
                               max_retries=0)
    assert adapter.chat("Hi").text == "echo: Hi"
    adapter.close()


# -- streaming events ------------------------------------------------------------------------------
def test_protocol_example_stream(raw: RawServer, raw_claude: AnthropicAdapter) -> None:
    raw.stream(
        start(),
        block(0, {"type": "thinking", "thinking": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Let me"}),
        delta(0, {"type": "thinking_delta", "thinking": " think."}),
        delta(0, {"type": "signature_delta", "signature": "EqQBsig=="}),
        stop(0),
        PING,
        block(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "Let me check."}),
        stop(1),
        block(2, {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}}),
        delta(2, {"type": "input_json_delta", "partial_json": '{"city": "Par'}),
        PING,
        delta(2, {"type": "input_json_delta", "partial_json": 'is"}'}),
        stop(2),
        *end("tool_use", {"output_tokens": 89}),
    )
    with raw_claude.stream("Weather in Paris?", tools=[WEATHER]) as stream:
        deltas = list(stream)
    response = stream.response
    assert [d.type for d in deltas] == [
        "thinking_delta", "thinking_delta", "text_delta", "tool_use_start",
        "tool_use_delta", "tool_use_delta", "tool_use_end"]
    assert response.content == [
        ThinkingBlock(thinking="Let me think.", signature="EqQBsig=="),
        TextBlock("Let me check."),
        ToolUseBlock(id="toolu_01", name="get_weather", arguments={"city": "Paris"}),
    ]
    assert response.stop_reason == "tool_use"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (25, 89)
    assert response.model == MODEL
    assert response.provider_data == {"id": "msg_01"}
    assert raw.requests[0].json["stream"] is True


def test_cumulative_usage_takes_the_last_value(raw: RawServer,
                                               raw_claude: AnthropicAdapter) -> None:
    raw.stream(
        start({"input_tokens": 20, "cache_read_input_tokens": 5,
               "cache_creation_input_tokens": 7, "output_tokens": 1}),
        block(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "hi"}),
        stop(0),
        {"type": "message_delta", "delta": {"stop_reason": None}, "usage": {"output_tokens": 10}},
        *end("end_turn", {"input_tokens": 20, "cache_read_input_tokens": 5,
                          "cache_creation_input_tokens": 7, "output_tokens": 25}),
    )
    usage = raw_claude.chat("x", stream=True).usage
    assert (usage.input_tokens, usage.output_tokens) == (20, 25)
    assert (usage.cache_read_tokens, usage.cache_creation_tokens) == (5, 7)
    assert usage.total_tokens == 57


def test_empty_tool_input_means_empty_object(raw: RawServer,
                                             raw_claude: AnthropicAdapter) -> None:
    raw.stream(
        start(),
        block(0, {"type": "tool_use", "id": "toolu_a", "name": "now", "input": {}}),
        delta(0, {"type": "input_json_delta", "partial_json": ""}),
        stop(0),
        block(1, {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}}),
        stop(1),
        *end("tool_use"),
    )
    response = raw_claude.chat("x", stream=True)
    assert [(c.id, c.arguments, c.arguments_error) for c in response.tool_calls] == [
        ("toolu_a", {}, None), ("toolu_b", {}, None)]


@pytest.mark.parametrize("late", [None, "after its block's stop", "after message_stop"])
def test_citations_redacted_and_unknown_events(raw: RawServer, raw_claude: AnthropicAdapter,
                                               late: str | None) -> None:
    citation = {"type": "char_location", "cited_text": "blue", "document_index": 0,
                "start_char_index": 0, "end_char_index": 4}
    fields = [delta(1, {"type": "citations_delta", "citation": citation}),
              delta(1, {"type": "brand_new_delta", "stuff": 1})]
    raw.stream(
        start(),
        PING,
        block(0, {"type": "redacted_thinking", "data": "ENCRYPTED=="}),
        stop(0),
        block(1, {"type": "text", "text": "", "citations": []}),
        delta(1, {"type": "text_delta", "text": "The sky is blue"}),
        *(fields if late is None else []),
        {"type": "brand_new_event", "x": 1},
        delta(1, {"type": "text_delta", "text": "."}),
        stop(1),
        *(fields if late == "after its block's stop" else []),
        *end(),
        *(fields if late == "after message_stop" else []),
    )
    response = raw_claude.chat("x", stream=True)
    # The citation and the unknown delta's field stay with the text block, as the non-streamed
    # answer would show them (the unknown event is ignored), also when they come late (they
    # were dropped after the block's stop).
    kept = {"anthropic": {"extra": {"citations": [citation], "stuff": 1}}}
    assert response.content == [RedactedThinkingBlock(data="ENCRYPTED=="),
                                TextBlock("The sky is blue.", provider_data=kept)]
    # Next turn: the citations go back with the text, the field the request does not know does not.
    raw.stream(start(), *end())
    raw_claude.chat([Message("user", "x"), response.to_message(), Message("user", "why?")],
                    stream=True)
    sent = raw.requests[-1].json["messages"][1]["content"]
    assert sent == [{"type": "redacted_thinking", "data": "ENCRYPTED=="},
                    {"type": "text", "text": "The sky is blue.", "citations": [citation]}]


@pytest.mark.parametrize("late", [False, True], ids=["in-order", "after-its-stop"])
def test_a_thinking_blocks_unknown_field_stays_with_it(late: bool) -> None:
    from dispatch_nb.stream import Accumulator
    from dispatch_nb.wire.anthropic import MessagesStreamParser

    acc = Accumulator()
    parser = MessagesStreamParser(acc)
    field = delta(0, {"type": "odd_delta", "note": "x"})
    for event in [start(), block(0, {"type": "thinking", "thinking": ""}),
                  delta(0, {"type": "thinking_delta", "thinking": "Hm."}),
                  *([] if late else [field]), stop(0), *([field] if late else []), *end()]:
        list(parser.handle(event))
    (thinking,) = acc.finish().content
    assert thinking.provider_data == {"anthropic": {"extra": {"note": "x"}}}


def test_unknown_block_streamed_with_its_own_deltas_ends_as_the_whole_block(
        raw: RawServer, raw_claude: AnthropicAdapter) -> None:
    """A ``compaction`` block streams as ``content: null`` + ``compaction_delta`` events; the
    adapter has no rule for either, and merges the deltas into the block generically."""
    summary = "The user asked about trains to Porto; fares compared."
    raw.stream(
        start(),
        block(0, {"type": "compaction", "content": None}),
        delta(0, {"type": "compaction_delta", "content": summary[:20]}),
        delta(0, {"type": "compaction_delta", "content": summary[20:]}),
        stop(0),
        block(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "Booked."}),
        stop(1),
        *end(),
    )
    response = raw_claude.chat("x", stream=True)
    compaction = {"type": "compaction", "content": summary}
    assert response.content == [
        TextBlock("", provider_data={"anthropic": {"block": compaction}}), TextBlock("Booked.")]
    raw.stream(start(), *end())
    raw_claude.chat([Message("user", "x"), response.to_message(), Message("user", "and?")],
                    stream=True)
    assert raw.requests[-1].json["messages"][1]["content"] == [
        compaction, {"type": "text", "text": "Booked."}]


@pytest.mark.parametrize("mode", ["json", "stream", "async"])
def test_compaction_and_server_tools_go_back_as_they_came(claude: AnthropicAdapter,
                                                          fake: AnthropicFake, mode: str) -> None:
    """A streamed ``compaction`` block used to end with ``content: null`` (its summary arrives
    only in ``compaction_delta`` events), and the next turn was rejected."""
    cited = {"type": "text", "text": "Mild, about 22 °C.",
             "citations": [{"type": "web_search_result_location", "url": "https://w.example/l",
                            "title": "Lisbon", "encrypted_index": "Eo8fake",
                            "cited_text": "22 °C"}]}
    fake.push(AnthropicTurn(content=[COMPACTION, SERVER_TOOL_USE, WEB_SEARCH_RESULT, cited]),
              Turn(text="Pack a light jacket."))
    history = [Message("user", "Weather in Lisbon in May?")]
    if mode == "async":
        first = asyncio.run(claude.achat(history, stream=True))
    else:
        first = claude.chat(history, stream=mode == "stream")
    assert first.text == "Mild, about 22 °C."
    assert [(b.provider_data or {}).get("anthropic", {}).get("block", {}).get("type")
            for b in first.content] == ["compaction", "server_tool_use", "web_search_tool_result",
                                        None]
    history += [first.to_message(), Message("user", "What should I pack?")]
    assert claude.chat(history, stream=mode != "json").text == "Pack a light jacket."
    assert fake.last_request.json["messages"][1]["content"] == [
        COMPACTION, SERVER_TOOL_USE, WEB_SEARCH_RESULT, cited]
    assert fake.rejections == []


def test_fake_rejects_a_compaction_block_without_its_summary(claude: AnthropicAdapter,
                                                             fake: AnthropicFake) -> None:
    lost = TextBlock("", provider_data={"anthropic": {"block": {"type": "compaction",
                                                                "content": None}}})
    with pytest.raises(RequestError) as info:
        claude.chat([Message("user", "x"), Message("assistant", [lost, TextBlock("ok")]),
                     Message("user", "y")])
    assert info.value.status_code == 400
    assert info.value.message == "messages.1.content.0.content: Input should be a valid string"


@pytest.mark.parametrize(
    ("wire", "canonical", "kept"),
    [
        ("pause_turn", "pause_turn", None),
        ("refusal", "refusal", None),
        ("max_tokens", "max_tokens", None),
        ("model_context_window_exceeded", "max_tokens", "model_context_window_exceeded"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_stop_reasons(claude: AnthropicAdapter, fake: AnthropicFake, wire: str, canonical: str,
                      kept: str | None, stream: bool) -> None:
    fake.push(Turn(text="partial answer", stop_reason=wire))
    response = claude.chat("x", stream=stream)
    assert response.stop_reason == canonical
    assert (response.provider_data or {}).get("stop_reason") == kept


def test_stop_sequence_is_recorded(raw: RawServer, raw_claude: AnthropicAdapter) -> None:
    raw.stream(start(), block(0, {"type": "text", "text": ""}),
               delta(0, {"type": "text_delta", "text": "1, 2, 3"}), stop(0),
               *end("stop_sequence", stop_sequence="4"))
    response = raw_claude.chat("count", stream=True, stop=["4"])
    assert response.stop_reason == "stop_sequence"
    assert response.provider_data == {"id": "msg_01", "stop_sequence": "4"}
    assert raw.requests[0].json["stop_sequences"] == ["4"]


@pytest.mark.parametrize(
    ("error_type", "error_class", "status"),
    [
        ("overloaded_error", ServerError, 529),
        ("api_error", ServerError, 500),
        ("rate_limit_error", RateLimitError, 429),
        ("invalid_request_error", RequestError, 400),
    ],
)
def test_in_stream_error_event(claude: AnthropicAdapter, fake: AnthropicFake, error_type: str,
                               error_class: type, status: int) -> None:
    fake.push(Turn(text="abcdefgh", chunk=2, error_after=3,
                   error=Fail(status, "Overloaded" if status == 529 else "boom", error_type)))
    with pytest.raises(error_class) as info:
        claude.chat("x", stream=True)
    err = info.value
    assert err.provider == "anthropic"
    assert err.provider_code == error_type
    assert err.partial is not None and err.partial.text == "abcdef"


def test_stream_cut_before_message_stop(raw: RawServer, raw_claude: AnthropicAdapter) -> None:
    raw.stream(start(), block(0, {"type": "text", "text": ""}),
               delta(0, {"type": "text_delta", "text": "half an ans"}))
    with pytest.raises(APIConnectionError, match="message_stop") as info:
        raw_claude.chat("x", stream=True)
    assert info.value.code == "network_error"
    assert info.value.partial is not None and info.value.partial.text == "half an ans"


def test_server_tool_blocks_round_trip_for_pause_turn(raw: RawServer,
                                                      raw_claude: AnthropicAdapter) -> None:
    search_result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                     "content": [{"type": "web_search_result", "url": "https://x.test",
                                  "title": "X", "encrypted_content": "EncR=="}]}
    raw.stream(
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "Searching."}),
        stop(0),
        block(1, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                  "input": {}}),
        delta(1, {"type": "input_json_delta", "partial_json": '{"query": '}),
        delta(1, {"type": "input_json_delta", "partial_json": '"weather"}'}),
        stop(1),
        block(2, search_result),
        stop(2),
        *end("pause_turn"),
    )
    raw.stream(start(), block(0, {"type": "text", "text": ""}),
               delta(0, {"type": "text_delta", "text": "Sunny."}), stop(0), *end())
    first = raw_claude.chat("weather?", stream=True)
    assert first.stop_reason == "pause_turn"
    assert first.text == "Searching."
    assert first.tool_calls == []
    history = [Message("user", "weather?"), first.to_message()]
    assert raw_claude.chat(history, stream=True).text == "Sunny."
    sent = raw.requests[1].json["messages"][1]
    assert sent == {"role": "assistant", "content": [
        {"type": "text", "text": "Searching."},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
         "input": {"query": "weather"}},
        search_result,
    ]}


def test_json_body_through_the_same_accumulator(raw: RawServer,
                                                raw_claude: AnthropicAdapter) -> None:
    raw.replies.append(Reply.json({
        "id": "msg_9", "type": "message", "role": "assistant", "model": MODEL,
        "content": [
            {"type": "thinking", "thinking": "Hmm.", "signature": "SIG"},
            {"type": "redacted_thinking", "data": "RED"},
            {"type": "text", "text": "Calling.", "citations": None},
            {"type": "tool_use", "id": "toolu_9", "name": "get_weather",
             "input": {"city": "Nice", "days": [1, 2]}},
            {"type": "tool_use", "id": "toolu_10", "name": "now", "input": {}},
        ],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 30, "cache_read_input_tokens": 100,
                  "cache_creation_input_tokens": 0, "output_tokens": 40},
    }))
    response = raw_claude.chat("x", tools=[WEATHER])
    assert response.content == [
        ThinkingBlock(thinking="Hmm.", signature="SIG"),
        RedactedThinkingBlock(data="RED"),
        TextBlock("Calling."),
        ToolUseBlock(id="toolu_9", name="get_weather", arguments={"city": "Nice", "days": [1, 2]}),
        ToolUseBlock(id="toolu_10", name="now", arguments={}),
    ]
    assert response.stop_reason == "tool_use"
    assert (response.usage.input_tokens, response.usage.cache_read_tokens) == (30, 100)


# -- the thinking round trip against the strict fake -------------------------------------------------
THOUGHT = "Paris weather: use the tool."


def _thinking_turn() -> Turn:
    return Turn(thinking=THOUGHT, signature="EqQBsig/one+==", redacted_thinking=["RED_A", "RED_B"],
                text="Checking.", tool_calls=[ToolCall("toolu_1", "get_weather",
                                                       {"city": "Paris"})])


def _first_round(claude: AnthropicAdapter, fake: AnthropicFake,
                 stream: bool) -> tuple[list[Message], Any]:
    fake.push(_thinking_turn())
    history = [Message("user", "Weather in Paris?")]
    first = claude.chat(history, tools=[WEATHER], stream=stream,
                        thinking={"type": "enabled", "budget_tokens": 2048})
    return history, first


def _result() -> Message:
    return Message("user", [ToolResultBlock(tool_use_id="toolu_1", content="18 °C")])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_thinking_round_trip_is_byte_for_byte(claude: AnthropicAdapter, fake: AnthropicFake,
                                              stream: bool) -> None:
    history, first = _first_round(claude, fake, stream)
    assert [b.type for b in first.content] == [
        "thinking", "redacted_thinking", "redacted_thinking", "text", "tool_use"]
    fake.push(Turn(text="18 °C."))
    second = claude.chat([*history, first.to_message(), _result()], tools=[WEATHER],
                         stream=stream, thinking={"type": "enabled", "budget_tokens": 2048})
    assert second.text == "18 °C."
    assert fake.rejections == []
    assistant = fake.last_request.json["messages"][1]
    assert assistant == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": THOUGHT, "signature": "EqQBsig/one+=="},
        {"type": "redacted_thinking", "data": "RED_A"},
        {"type": "redacted_thinking", "data": "RED_B"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]}
    assert fake.thinking_signatures_of(fake.last_request) == ["EqQBsig/one+=="]


def _tampered(first: Any, how: str) -> Message:
    blocks = [b.model_copy() for b in first.content]
    if how == "signature":
        blocks[0] = blocks[0].model_copy(update={"signature": blocks[0].signature[:-3] + "x=="})
    elif how == "thinking text":
        blocks[0] = blocks[0].model_copy(update={"thinking": THOUGHT + " "})
    elif how == "redacted data":
        blocks[1] = RedactedThinkingBlock(data="RED_Z")
    elif how == "reordered":
        blocks[1], blocks[2] = blocks[2], blocks[1]
    elif how == "thinking moved after tool_use":
        blocks = blocks[3:] + blocks[:3]
    elif how == "dropped":
        blocks = [b for b in blocks if b.type not in ("thinking", "redacted_thinking")]
    elif how == "one redacted dropped":
        del blocks[2]
    return Message("assistant", blocks)


@pytest.mark.parametrize(
    ("how", "complaint"),
    [
        ("signature", "Invalid `signature`"),
        ("thinking text", "Invalid `signature`"),
        ("redacted data", "Invalid `data`"),
        ("reordered", "cannot be modified"),
        ("thinking moved after tool_use", "cannot be modified"),
        ("dropped", "cannot be modified"),
        ("one redacted dropped", "cannot be modified"),
    ],
)
def test_strict_fake_rejects_a_changed_thinking_turn(claude: AnthropicAdapter,
                                                     fake: AnthropicFake, how: str,
                                                     complaint: str) -> None:
    history, first = _first_round(claude, fake, stream=True)
    with pytest.raises(RequestError) as info:
        claude.chat([*history, _tampered(first, how), _result()], tools=[WEATHER])
    assert info.value.status_code == 400
    assert complaint in info.value.message
    assert len(fake.rejections) == 1


def test_foreign_thinking_is_left_out(claude: AnthropicAdapter, fake: AnthropicFake) -> None:
    # Reasoning Anthropic did not sign would be rejected: unsigned thinking, and thinking whose
    # signature is another provider's (OpenAI encrypted reasoning, Copilot reasoning_opaque).
    openai = ThinkingBlock(thinking="o-series summary", signature="gAAAAencrypted",
                           provider_data={"openai_responses": {"item": {"id": "rs_1"}}})
    copilot = RedactedThinkingBlock(data="opaque", provider_data={"openai_chat": {}})
    history = [Message("user", "Hi"),
               Message("assistant", [ThinkingBlock(thinking="from elsewhere"), openai, copilot,
                                     TextBlock("Hello")]),
               Message("user", "Again")]
    claude.chat(history)
    assert fake.last_request.json["messages"][1]["content"] == [{"type": "text", "text": "Hello"}]


def test_async_thinking_round_trip(claude: AnthropicAdapter, fake: AnthropicFake) -> None:
    fake.push(_thinking_turn(), Turn(text="18 °C."))

    async def main() -> str:
        history = [Message("user", "Weather in Paris?")]
        first = await claude.achat(history, tools=[WEATHER], stream=True)
        second = await claude.achat([*history, first.to_message(), _result()], tools=[WEATHER])
        return second.text

    assert asyncio.run(main()) == "18 °C."
    assert fake.rejections == []


# -- the fake is as strict as the real API (it is the oracle above) --------------------------------
def _post(fake: AnthropicFake, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{fake.base_url}/v1/messages", json=body,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})


@pytest.mark.parametrize(
    ("messages", "extra", "complaint"),
    [
        ([{"role": "user", "content": "Hi"}], {"max_tokens": None}, "max_tokens: Field required"),
        ([{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hi"}], {},
         'Unexpected role "system"'),
        ([{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi again"}], {},
         "roles must alternate"),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], {},
         "text content blocks must be non-empty"),
        ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                        "content": "1"}]}], {},
         "unexpected `tool_use_id`"),
        ([{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_y", "name": "f",
                                             "input": {}}]},
          {"role": "user", "content": "what?"}], {},
         "without `tool_result`"),
        ([{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": [{"type": "thinking", "thinking": "t",
                                             "signature": "forged"}]},
          {"role": "user", "content": "again"}], {},
         "Invalid `signature`"),
    ],
)
def test_fake_rejects_what_the_api_rejects(fake: AnthropicFake, messages: list[dict[str, Any]],
                                           extra: dict[str, Any], complaint: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "messages": messages, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    reply = _post(fake, body)
    assert reply.status_code == 400
    error = reply.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert complaint in error["error"]["message"]


# -- HTTP errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fail", "error_class", "code", "retryable"),
    [
        (Fail(400, "messages: field required"), RequestError, "invalid_request", False),
        (Fail(400, "prompt is too long: 210000 tokens > 200000 maximum"), ContextLengthError,
         "context_length_exceeded", False),
        (Fail(401, "invalid x-api-key"), AuthenticationError, "authentication_failed", False),
        (Fail(402, "Your credit balance is too low"), RateLimitError, "quota_exceeded", False),
        (Fail(403, "not allowed"), AuthenticationError, "authentication_failed", False),
        (Fail(404, f"model: {MODEL}"), ModelUnavailableError, "model_unavailable", False),
        (Fail(413, "Request exceeds the maximum allowed number of bytes"), RequestError,
         "invalid_request", False),
        (Fail(429, "Number of request tokens has exceeded your rate limit",
              headers={"retry-after": "3"}), RateLimitError, "rate_limited", True),
        (Fail(429, "You have reached your specified API usage limits",
              "enforced_spend_limit_reached"), RateLimitError, "quota_exceeded", False),
        (Fail(500, "Internal server error"), ServerError, "server_error", True),
        (Fail(504, "Gateway timeout"), ServerError, "server_error", True),
        (Fail(529, "Overloaded"), ServerError, "server_error", True),
    ],
    ids=lambda v: str(v.status) + (f"-{v.error_type}" if v.error_type else "")
    if isinstance(v, Fail) else None,
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_error_table(claude: AnthropicAdapter, fake: AnthropicFake, fail: Fail, error_class: type,
                     code: str, retryable: bool, stream: bool) -> None:
    fake.push(fail)
    with pytest.raises(error_class) as info:
        claude.chat("x", stream=stream)
    err = info.value
    assert type(err) is error_class
    assert (err.status_code, err.code, err.retryable) == (fail.status, code, retryable)
    assert err.provider == "anthropic"
    assert err.message == fail.message
    assert err.request_id == "req_fake_0001"
    if fail.status == 429 and retryable:
        assert err.retry_after == 3


def test_plain_text_413_from_the_proxy(raw: RawServer, raw_claude: AnthropicAdapter) -> None:
    raw.replies.append(Reply(status=413, headers={"content-type": "text/html"},
                             body=b"<html>413 Request Entity Too Large</html>"))
    with pytest.raises(RequestError, match="Too Large") as info:
        raw_claude.chat("x")
    assert info.value.status_code == 413


def test_overloaded_is_retried_spend_limit_is_not(fake: AnthropicFake) -> None:
    adapter = AnthropicAdapter(MODEL, api_key=KEY, base_url=fake.base_url, max_retries=2)
    fake.push(Fail(529, "Overloaded"), Turn(text="second try"))
    assert adapter.chat("x", stream=True).text == "second try"
    assert len(fake.chat_requests) == 2
    fake.push(Fail(429, "spend cap", "enforced_spend_limit_reached"), Turn(text="never"))
    with pytest.raises(RateLimitError) as info:
        adapter.chat("x")
    assert info.value.code == "quota_exceeded"
    assert len(fake.chat_requests) == 3
    adapter.close()


# -- models, tokens, validation ----------------------------------------------------------------------
def test_list_models_pages_through(fake: AnthropicFake) -> None:
    fake.page_size = 1
    adapter = AnthropicAdapter(MODEL, api_key=KEY, base_url=fake.base_url)
    models = adapter.list_models()
    assert [(m.id, m.name) for m in models] == [("claude-sonnet-4-5", "Claude Sonnet 4.5"),
                                                ("claude-haiku-4-5", "Claude Haiku 4.5")]
    assert all(m.supports_tool_use and m.vendor == "anthropic" for m in models)
    paths = [r.path for r in fake.requests]
    assert paths == ["/v1/models", "/v1/models"]
    assert fake.requests[1].query["after_id"] == ["claude-sonnet-4-5"]
    assert adapter.validate().ok
    assert "2 models" in adapter.validate().reason
    adapter.close()


def test_validate_rejected_key(fake: AnthropicFake) -> None:
    adapter = AnthropicAdapter(MODEL, api_key="sk-ant-wrong", base_url=fake.base_url)
    result = adapter.validate()
    assert not result
    assert "x-api-key" in result.reason
    adapter.close()


def test_count_tokens(claude: AnthropicAdapter, fake: AnthropicFake) -> None:
    count = claude.count_tokens([Message("user", "How many tokens is this?")],
                                system="Be brief.", tools=[WEATHER])
    sent = fake.requests[-1]
    assert sent.path == "/v1/messages/count_tokens"
    assert set(sent.json) == {"model", "messages", "system", "tools"}
    assert count == AnthropicFake.token_count(sent.json) > 3


def test_count_tokens_failures(fake: AnthropicFake, raw: RawServer) -> None:
    bad = AnthropicAdapter(MODEL, api_key="sk-ant-wrong", base_url=fake.base_url)
    with pytest.raises(AuthenticationError) as info:
        bad.count_tokens("hi")
    assert (info.value.status_code, info.value.code) == (401, "authentication_failed")
    broken = AnthropicAdapter(MODEL, api_key=KEY, base_url=raw.server.url)
    raw.replies.append(Reply.json({"type": "error", "error": {"type": "not_found_error",
                                                              "message": "Not found"}}, 404))
    assert broken.count_tokens("hi") == -1  # e.g. a proxy without the endpoint
    raw.replies.append(Reply.json({"type": "error", "error": {"type": "api_error",
                                                              "message": "boom"}}, 500))
    assert broken.count_tokens("hi") == -1
    raw.replies.append(Reply.json({"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages.0.content: bad"}}, 400))
    with pytest.raises(RequestError) as info:
        broken.count_tokens("hi")
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")
    bad.close()
    broken.close()


def test_request_body_is_valid_json_for_every_block(claude: AnthropicAdapter,
                                                    fake: AnthropicFake) -> None:
    # Unicode, quotes and newlines survive orjson on the way out.
    text = 'He said "héllo"\n— ok 🙂'
    claude.chat(text)
    assert json.loads(fake.last_request.body)["messages"][0]["content"][0]["text"] == text
