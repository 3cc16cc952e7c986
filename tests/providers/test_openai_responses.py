"""The Responses API path (``backend="official"``) against real loopback servers: the strict fake,
and raw event streams for what a scripted Turn cannot produce."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch_nb import (
    APIConnectionError,
    ImageBlock,
    Message,
    RateLimitError,
    RequestError,
    ServerError,
    Session,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from dispatch_nb.providers.openai import OpenAIAdapter
from dispatch_nb.wire.chat_completions import chat_usage
from dispatch_nb.wire.responses import is_reasoning_model

from ..fakes.openai_responses import (
    CODE_INTERPRETER_CALL,
    COMPACTION,
    FILE_SEARCH_CALL,
    IMAGE_GENERATION_CALL,
    MCP_APPROVAL_REQUEST,
    MCP_CALL,
    MCP_LIST_TOOLS,
    WEB_SEARCH_CALL,
    OpenAIResponsesFake,
    ResponsesTurn,
)
from ..fakes.provider import WEATHER, Fail, ToolCall, Turn, sse_event
from ..fakes.server import LoopbackServer, Reply

KEY = "sk-proj-SECRET-0123456789"


@pytest.fixture
def fake() -> Iterator[OpenAIResponsesFake]:
    with OpenAIResponsesFake(api_key=KEY) as f:
        yield f


def gpt(fake: OpenAIResponsesFake | LoopbackServer, model: str = "gpt-5",
        **kw: Any) -> OpenAIAdapter:
    base = fake.base_url if isinstance(fake, OpenAIResponsesFake) else fake.url + "/v1"
    kw.setdefault("max_retries", 0)
    kw.setdefault("api_key", KEY)
    return OpenAIAdapter(model, backend="official", base_url=base, **kw)


def raw_server(*events: dict[str, Any] | bytes) -> LoopbackServer:
    frames = [e if isinstance(e, bytes) else sse_event(e, event=e["type"]) for e in events]
    return LoopbackServer(lambda request: Reply.sse(frames))


def completed(output: list[dict[str, Any]] | None = None, status: str = "completed",
              **extra: Any) -> dict[str, Any]:
    response = {"id": "resp_1", "object": "response", "status": status, "model": "gpt-5",
                "output": output or [], "usage": {"input_tokens": 10, "output_tokens": 3,
                                                  "input_tokens_details": {"cached_tokens": 0}},
                **extra}
    return {"type": f"response.{status}", "response": response}


# -- request shape -------------------------------------------------------------------------------
def test_request_body_shape(fake: OpenAIResponsesFake) -> None:
    gpt(fake, max_tokens=500).chat(
        [Message(role="user", content=[TextBlock(text="What is this?"),
                                       ImageBlock(source="aGVsbG8=", media_type="image/png")])],
        system="Be brief.", tools=[WEATHER], tool_choice="get_weather", temperature=0.3,
        parallel_tool_calls=False, top_p=0.9,
    )
    body = fake.last_request.json
    assert fake.last_request.path == "/v1/responses"
    assert fake.last_request.header("authorization") == f"Bearer {KEY}"
    assert body["model"] == "gpt-5"
    assert body["instructions"] == "Be brief."
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["max_output_tokens"] == 500
    assert body["stream"] is False
    assert (body["temperature"], body["top_p"], body["parallel_tool_calls"]) == (0.3, 0.9, False)
    assert body["tools"] == [{"type": "function", "name": "get_weather",
                              "description": "Current weather for a city",
                              "parameters": WEATHER.parameters, "strict": False}]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["input"] == [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,aGVsbG8=", "detail": "auto"},
    ]}]


def test_non_reasoning_models_do_not_ask_for_encrypted_reasoning(
        fake: OpenAIResponsesFake) -> None:
    gpt(fake, "gpt-4.1").chat("x")
    assert "include" not in fake.last_request.json
    gpt(fake, "gpt-4.1").chat("x", reasoning={"effort": "low", "summary": "auto"})
    body = fake.last_request.json
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert [is_reasoning_model(m) for m in ("o3", "gpt-5-mini", "codex-mini-latest", "gpt-4o",
                                            "gpt-4.1-nano", "gpt-5-chat-latest")] == [
        True, True, True, False, False, False]


def test_history_items_and_function_call_outputs(fake: OpenAIResponsesFake) -> None:
    fake.push(Turn(text="Checking.", tool_calls=[ToolCall("call_a", "get_weather",
                                                          {"city": "Paris"})]),
              Turn(text="18 °C."))
    adapter = gpt(fake)
    first = adapter.chat("Weather?", tools=[WEATHER], stream=True)
    history = [Message(role="user", content="Weather?"), first.to_message(),
               Message(role="user", content=[ToolResultBlock(tool_use_id="call_a", content="18"),
                                             TextBlock(text="thanks")])]
    assert adapter.chat(history, tools=[WEATHER]).text == "18 °C."
    items = fake.last_request.json["input"]
    assert [i["type"] for i in items] == ["message", "message", "function_call",
                                          "function_call_output", "message"]
    assert items[1] == {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Checking.", "annotations": []}]}
    # No reasoning item in that turn: no server item ids either (store is false).
    assert items[2] == {"type": "function_call", "call_id": "call_a", "name": "get_weather",
                        "arguments": '{"city":"Paris"}'}
    assert items[3] == {"type": "function_call_output", "call_id": "call_a", "output": "18"}


def test_builtin_tools_pass_through(fake: OpenAIResponsesFake) -> None:
    gpt(fake).chat("news?", tools=[{"type": "web_search"}, WEATHER])
    tools = fake.last_request.json["tools"]
    assert tools[0] == {"type": "web_search"}
    assert tools[1]["name"] == "get_weather"


def test_stop_is_refused_and_options_converted(fake: OpenAIResponsesFake) -> None:
    adapter = gpt(fake)
    with pytest.raises(RequestError) as info:
        adapter.chat("x", stop=["END"])
    assert info.value.code == "invalid_request"
    assert "stop" in info.value.message
    assert fake.chat_requests == []
    # (strict: the fake, like the API, refuses a strict schema without these two)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    adapter.chat("x", response_format={"type": "json_schema", "json_schema": {
        "name": "thing", "schema": schema, "strict": True}}, text={"verbosity": "low"},
        reasoning="high")
    body = fake.last_request.json
    assert body["text"] == {"verbosity": "low", "format": {
        "type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    assert body["reasoning"] == {"effort": "high"}


# -- reasoning round trips -----------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_reasoning_items_round_trip_verbatim(fake: OpenAIResponsesFake, stream: bool) -> None:
    fake.push(Turn(thinking="Need the weather.", signature="gAAAA-encrypted",
                   redacted_thinking=["gAAAA-second"], text="Let me look.",
                   tool_calls=[ToolCall("call_r", "get_weather", {"city": "Rome"})]),
              Turn(text="21 °C."))
    adapter = gpt(fake)
    first = adapter.chat("Rome?", tools=[WEATHER], stream=stream)
    assert [b.type for b in first.content] == ["thinking", "thinking", "text", "tool_use"]
    thinking = first.content[0]
    assert isinstance(thinking, ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == ("Need the weather.", "gAAAA-encrypted")
    item = thinking.provider_data["openai_responses"]["item"]  # type: ignore[index]
    assert item["type"] == "reasoning" and item["id"].startswith("rs_")

    saved = Message.model_validate_json(first.to_message().model_dump_json())
    history = [Message(role="user", content="Rome?"), saved,
               Message(role="user", content=[ToolResultBlock(tool_use_id="call_r",
                                                             content="21")])]
    assert adapter.chat(history, tools=[WEATHER], stream=stream).text == "21 °C."
    items = fake.last_request.json["input"]
    assert [i["type"] for i in items] == ["message", "reasoning", "reasoning", "message",
                                          "function_call", "function_call_output"]
    assert items[1] == fake.issued_reasoning[item["id"]]
    # The items that followed a reasoning item carry their ids so the API can pair them.
    assert items[3]["id"].startswith("msg_") and items[4]["id"].startswith("fc_")
    assert fake.thinking_signatures_of(fake.last_request) == ["gAAAA-encrypted", "gAAAA-second"]


def test_altered_reasoning_item_is_rejected(fake: OpenAIResponsesFake) -> None:
    fake.push(Turn(thinking="secret plan", signature="ENC", text="ok"))
    adapter = gpt(fake)
    first = adapter.chat("x", stream=True)
    tampered = first.to_message()
    block = tampered.blocks[0]
    assert isinstance(block, ThinkingBlock)
    block.provider_data["openai_responses"]["item"]["encrypted_content"] = "FORGED"  # type: ignore[index]
    with pytest.raises(RequestError) as info:
        adapter.chat([Message(role="user", content="x"), tampered,
                      Message(role="user", content="y")])
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")
    assert "could not be verified" in info.value.message


def test_reasoning_dropped_for_non_reasoning_models_and_dangling(
        fake: OpenAIResponsesFake) -> None:
    fake.push(Turn(thinking="t", signature="ENC", text="a"))
    first = gpt(fake).chat("x")
    history = [Message(role="user", content="x"), first.to_message(),
               Message(role="user", content="y")]
    gpt(fake, "gpt-4.1").chat(history)
    items = fake.last_request.json["input"]
    assert [i["type"] for i in items] == ["message", "message", "message"]
    assert "id" not in items[1]  # no reasoning item sent: no paired id either
    # A reasoning item with nothing after it in its turn is not sent (the API would reject it).
    only_thinking = Message(role="assistant", content=[first.content[0]])
    gpt(fake).chat([Message(role="user", content="x"), only_thinking,
                    Message(role="user", content="y")])
    assert [i["type"] for i in fake.last_request.json["input"]] == ["message", "message"]


def test_reasoning_summary_parts_stream_as_thinking() -> None:
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "model": "o3",
                                                  "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"type": "reasoning", "id": "rs_1", "summary": []}},
        {"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "summary_index": 0},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "summary_index": 0,
         "delta": "First."},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "summary_index": 1,
         "delta": "Second."},
        {"type": "response.output_item.done", "output_index": 0,
         "item": {"type": "reasoning", "id": "rs_1", "encrypted_content": "E",
                  "summary": [{"type": "summary_text", "text": "First."},
                              {"type": "summary_text", "text": "Second."}]}},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
         "content_index": 0, "delta": "Answer"},
        {"type": "response.output_text.annotation.added", "item_id": "msg_1",
         "annotation": {"type": "url_citation"}},
        completed(model="o3"),
    ]
    with raw_server(*events) as server, gpt(server) as adapter, \
            adapter.stream("x") as stream:
        kinds = [d.type for d in stream]
    response = stream.response
    assert kinds == ["thinking_delta", "thinking_delta", "text_delta"]
    assert response.thinking == "First.\n\nSecond."
    assert response.content[0].signature == "E"  # type: ignore[union-attr]
    assert response.model == "o3"
    assert response.text == "Answer"
    assert response.provider_data == {"openai_responses": {"id": "resp_1"}}


# -- stop reasons, usage, failures ---------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize(("stop", "expected"), [("max_tokens", "max_tokens"),
                                                ("content_filter", "content_filter"),
                                                ("refusal", "refusal")])
def test_stop_reasons(fake: OpenAIResponsesFake, stream: bool, stop: str, expected: str) -> None:
    fake.push(Turn(text="cut off", stop_reason=stop))
    response = gpt(fake).chat("x", stream=stream)
    assert response.stop_reason == expected
    assert response.text == "cut off"


def test_usage_with_cached_tokens(fake: OpenAIResponsesFake) -> None:
    fake.push(Turn(text="x", input_tokens=100, cache_read_tokens=900, output_tokens=12))
    usage = gpt(fake).chat("x", stream=True).usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens) == (100, 900, 12)
    assert chat_usage({"input_tokens": 50, "output_tokens": 1, "input_tokens_details":
                       {"cached_tokens": 20, "cache_write_tokens": 10}},
                      "input_tokens", "output_tokens").input_tokens == 20


@pytest.mark.parametrize("style", ["error", "failed"])
def test_in_stream_failures(style: str) -> None:
    with OpenAIResponsesFake(error_style=style) as fake:
        fake.push(Turn(text="abcdef", chunk=2, error_after=2,
                       error=Fail(429, "Rate limit reached", "rate_limit_exceeded")),
                  Turn(text="abcdef", chunk=2, error_after=1, error=Fail(500, "boom")))
        adapter = gpt(fake)
        with pytest.raises(RateLimitError) as info:
            adapter.chat("x", stream=True)
        assert (info.value.status_code, info.value.code) == (429, "rate_limited")
        assert info.value.partial is not None and info.value.partial.text == "abcd"
        with pytest.raises(ServerError) as info2:
            adapter.chat("x", stream=True)
        assert (info2.value.status_code, info2.value.code) == (500, "server_error")
        assert info2.value.partial is not None and info2.value.partial.text == "ab"


def test_stream_without_terminal_event_is_incomplete() -> None:
    events = [{"type": "response.output_text.delta", "item_id": "m", "delta": "half"}]
    with raw_server(*events) as server, pytest.raises(APIConnectionError) as info:
        gpt(server).chat("x", stream=True)
    assert info.value.code == "network_error"
    assert info.value.partial is not None and info.value.partial.text == "half"


def test_items_only_in_done_events_or_only_in_completed() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Oslo"}'}
    message = {"type": "message", "id": "msg_1", "role": "assistant",
               "content": [{"type": "output_text", "text": "Looking."}]}
    only_done = [{"type": "response.output_item.done", "output_index": 0, "item": message},
                 {"type": "response.output_item.done", "output_index": 1, "item": call},
                 completed([message, call])]
    only_completed = [completed([message, call])]
    for events in (only_done, only_completed):
        with raw_server(*events) as server:
            response = gpt(server).chat("x", stream=True, tools=[WEATHER])
        assert response.text == "Looking."
        assert [(c.id, c.arguments) for c in response.tool_calls] == [("call_1", {"city": "Oslo"})]
        assert response.stop_reason == "tool_use"


def test_malformed_function_arguments_and_builtin_output_items() -> None:
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed",
              "action": {"type": "search", "query": "news"}}
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": search},
        {"type": "response.output_item.done", "output_index": 0, "item": search},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": "function_call", "id": "fc_9", "call_id": "call_9",
                  "name": "get_weather", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_9", "delta": '{"ci'},
        {"type": "response.function_call_arguments.done", "item_id": "fc_9",
         "arguments": '{"ci'},
        completed(),
    ]
    with raw_server(*events) as server:
        response = gpt(server).chat("x", stream=True, tools=[WEATHER])
    call = response.tool_calls[0]
    assert call.arguments == {} and call.raw_arguments == '{"ci' and call.arguments_error
    assert response.provider_data["openai_responses"]["output_items"] == [search]  # type: ignore[index]
    # ... and the item itself is in the content, where the model put it, to go back next turn
    assert [b.type for b in response.content] == ["text", "tool_use"]
    assert response.content[0].provider_data == {  # type: ignore[union-attr]
        "openai_responses": {"item": search, "issuer": "openai"}}


# -- built-in tool items, output order -----------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_builtin_tool_items_go_back_in_order_in_a_session(fake: OpenAIResponsesFake,
                                                         stream: bool) -> None:
    """``[reasoning, web_search_call, reasoning, message]``: dropping the search item leaves the
    first reasoning item without its following item, which the API (and the fake) rejects."""
    later = {"type": "reasoning",
             "summary": [{"type": "summary_text", "text": "The search answered it."}]}
    fake.push(ResponsesTurn(thinking="Search the forecast.", text="Sunny, 24 °C.",
                            output=["thinking", WEB_SEARCH_CALL, later, "text"]),
              Turn(text="Yes, take sunglasses."))
    session = Session(gpt(fake), tools=[{"type": "web_search"}])
    first = session.send("Weather in Paris?", stream=stream)
    assert [b.type for b in first.content] == ["thinking", "text", "thinking", "text"]
    assert first.text == "Sunny, 24 °C."
    assert session.send("Sunglasses?", stream=stream).text == "Yes, take sunglasses."
    items = fake.last_request.json["input"]
    assert [i["type"] for i in items] == ["message", "reasoning", "web_search_call", "reasoning",
                                          "message", "message"]
    rs1, ws, rs2, answer = items[1:5]
    assert rs1 == fake.issued_reasoning[rs1["id"]] and rs2 == fake.issued_reasoning[rs2["id"]]
    assert ws == fake.issued_items[ws["id"]] == {**WEB_SEARCH_CALL, "id": ws["id"]}
    assert answer["id"].startswith("msg_")  # paired with the reasoning item before it

    # The history without the search item is exactly what OpenAI rejects.
    history = session.history[:2]
    cut = Message(role="assistant", content=[b for b in history[1].blocks
                                             if not (b.type == "text" and not b.text)])
    with pytest.raises(RequestError) as info:
        gpt(fake).chat([history[0], cut, Message(role="user", content="Sunglasses?")])
    assert info.value.status_code == 400
    assert info.value.message == (f"Item '{rs1['id']}' of type 'reasoning' was provided without "
                                  "its required following item.")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_every_builtin_item_kind_is_kept_verbatim_in_order(fake: OpenAIResponsesFake,
                                                          stream: bool) -> None:
    kinds = [FILE_SEARCH_CALL, CODE_INTERPRETER_CALL, IMAGE_GENERATION_CALL, MCP_LIST_TOOLS,
             MCP_CALL, COMPACTION]
    fake.push(ResponsesTurn(thinking="Use every tool.", text="All done.",
                            output=["thinking", *kinds, "text", MCP_APPROVAL_REQUEST]))
    response = gpt(fake).chat("Go.", stream=stream)
    assert [b.type for b in response.content] == ["thinking", *["text"] * 6, "text", "text"]
    kept = [b.provider_data["openai_responses"]["item"]  # type: ignore[index]
            for b in response.content if b.type == "text" and not b.text]
    assert [k["type"] for k in kept] == [k["type"] for k in kinds] + ["mcp_approval_request"]
    for item, fixture in zip(kept, [*kinds, MCP_APPROVAL_REQUEST], strict=True):
        assert item == {**fixture, "id": item["id"]}
    assert response.text == "All done."
    assert response.stop_reason == "end_turn"


def test_items_placed_by_output_index_not_arrival() -> None:
    """A reasoning item's ``output_item.done`` after the message's (OpenRouter): the blocks keep
    the output order and the message keeps the id that pairs it with the reasoning item."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E1"}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Hi.", "annotations": []}]}
    events = [
        {"type": "response.output_item.added", "output_index": 0,
         "item": {**reasoning, "encrypted_content": None}},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {**message, "content": [], "status": "in_progress"}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
         "content_index": 0, "delta": "Hi."},
        {"type": "response.output_item.done", "output_index": 1, "item": message},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        completed([reasoning, message]),
    ]
    with raw_server(*events) as server:
        response = gpt(server).chat("x", stream=True)
    assert [b.type for b in response.content] == ["thinking", "text"]
    assert response.content[0].signature == "E1"  # type: ignore[union-attr]
    assert response.content[1].provider_data == {"openai_responses": {"id": "msg_1"}}


@pytest.mark.parametrize("mode", ["stream", "async"])
def test_late_reasoning_done_events_round_trip(fake: OpenAIResponsesFake, mode: str) -> None:
    fake.push(ResponsesTurn(text="Lima it is.", late_reasoning_done=True,
                            tool_calls=[ToolCall("call_l", "get_weather", {"city": "Lima"})],
                            output=[{"type": "reasoning"}, "text", {"type": "reasoning"}, "tools"]),
              Turn(text="19 °C in Lima."))
    adapter = gpt(fake)
    history = [Message(role="user", content="Lima?")]
    if mode == "stream":
        first = adapter.chat(history, tools=[WEATHER], stream=True)
    else:
        first = asyncio.run(adapter.achat(history, tools=[WEATHER], stream=True))
    assert [b.type for b in first.content] == ["thinking", "text", "thinking", "tool_use"]
    history += [first.to_message(),
                Message(role="user", content=[ToolResultBlock(tool_use_id="call_l", content="19")])]
    assert adapter.chat(history, tools=[WEATHER]).text == "19 °C in Lima."
    sent = fake.last_request.json["input"]
    assert [i["type"] for i in sent] == ["message", "reasoning", "message", "reasoning",
                                         "function_call", "function_call_output"]
    assert sent[2]["id"].startswith("msg_") and sent[4]["id"].startswith("fc_")


def test_builtin_items_from_another_issuer_or_without_their_reasoning_stay_home() -> None:
    from dispatch_nb.adapter import ChatRequest
    from dispatch_nb.wire.responses import ResponsesWire

    def turn(issuer: str) -> Message:
        rs = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E"}
        ws = {**WEB_SEARCH_CALL, "id": "ws_1"}
        data = {"issuer": issuer}
        return Message(role="assistant", content=[
            ThinkingBlock(signature="E", provider_data={"openai_responses": {"item": rs, **data}}),
            TextBlock("", provider_data={"openai_responses": {"item": ws, **data}}),
            TextBlock("answer", provider_data={"openai_responses": {"id": "msg_1"}}),
        ])

    def sent(issuer: str, model: str) -> list[str]:
        request = ChatRequest(messages=[Message("user", "q"), turn(issuer), Message("user", "more")],
                              max_tokens=100)
        body = ResponsesWire("openai").build_body(request, model)
        return [i.get("id") or i["type"] for i in body["input"]]

    assert sent("openai", "gpt-5") == ["message", "rs_1", "ws_1", "msg_1", "message"]
    # Copilot's items cannot go to OpenAI; without its reasoning item the search item (whose id
    # names that reasoning) cannot go either, and the message goes without its id.
    assert sent("copilot", "gpt-5") == ["message", "message", "message"]
    assert sent("openai", "gpt-4.1") == ["message", "message", "message"]


# -- the fake is as strict as the API ------------------------------------------------------------
def test_function_call_output_without_matching_call_is_rejected(
        fake: OpenAIResponsesFake) -> None:
    with pytest.raises(RequestError) as info:
        gpt(fake).chat([Message(role="user", content=[ToolResultBlock(tool_use_id="call_x",
                                                                      content="r")])])
    assert (info.value.status_code, info.value.code) == (400, "invalid_request")
    assert "call_x" in info.value.message
    unanswered = [Message(role="user", content="x"),
                  Message(role="assistant", content=[ToolUseBlock(id="c1", name="get_weather")]),
                  Message(role="user", content="next")]
    with pytest.raises(RequestError) as info2:
        gpt(fake).chat(unanswered, tools=[WEATHER])
    assert (info2.value.status_code, info2.value.code) == (400, "invalid_request")
    assert "No tool output found" in info2.value.message


def test_max_output_tokens_minimum_is_enforced(fake: OpenAIResponsesFake) -> None:
    with pytest.raises(RequestError) as info:
        gpt(fake).chat("x", max_tokens=8)
    assert info.value.code == "invalid_request"
    assert "16" in info.value.message
    assert fake.chat_requests == []  # refused before sending, as the API would refuse it
    gpt(fake).chat("x", max_tokens=16)
    assert fake.last_request.json["max_output_tokens"] == 16


# -- auth and models -----------------------------------------------------------------------------
def test_missing_key_fails_at_call_time(monkeypatch: pytest.MonkeyPatch,
                                        fake: OpenAIResponsesFake) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    from dispatch_nb import AuthenticationError

    adapter = OpenAIAdapter("gpt-5", base_url=fake.base_url, max_retries=0)
    with pytest.raises(AuthenticationError) as info:
        adapter.chat("x")
    assert info.value.code == "authentication_failed"
    assert "OPENAI_API_KEY" in info.value.message
    assert fake.chat_requests == []
    check = adapter.validate()
    assert not check and "OPENAI_API_KEY" in check.reason
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)  # the key is for that server
    assert OpenAIAdapter("gpt-5").chat("x").text == "echo: x"


def test_wrong_key_is_an_authentication_error_without_the_secret(
        fake: OpenAIResponsesFake) -> None:
    from dispatch_nb import AuthenticationError

    adapter = gpt(fake, api_key="sk-wrong-SECRET")
    with pytest.raises(AuthenticationError) as info:
        adapter.chat("x")
    assert (info.value.status_code, info.value.code) == (401, "authentication_failed")
    assert "SECRET" not in str(info.value) and "SECRET" not in repr(info.value)
    assert "SECRET" not in repr(adapter)
    assert not adapter.validate()


def test_list_models(fake: OpenAIResponsesFake) -> None:
    adapter = gpt(fake)
    assert [m.id for m in adapter.list_models()] == ["gpt-4.1", "gpt-5"]
    assert adapter.validate()
    assert [m.id for m in asyncio.run(adapter.alist_models())] == ["gpt-4.1", "gpt-5"]


def test_encrypted_reasoning_goes_back_only_to_its_issuer() -> None:
    from dispatch_nb import Message, TextBlock, ThinkingBlock
    from dispatch_nb.adapter import ChatRequest
    from dispatch_nb.wire.responses import ResponsesWire

    def turn(issuer: str) -> Message:
        item = {"type": "reasoning", "id": f"rs_{issuer}", "summary": [],
                "encrypted_content": "gAAAA-opaque"}
        return Message(role="assistant", content=[
            ThinkingBlock(thinking="", signature="gAAAA-opaque",
                          provider_data={"openai_responses": {"item": item, "issuer": issuer}}),
            TextBlock("answer", provider_data={"openai_responses": {"id": "msg_1"}}),
        ])

    for issuer, expected in (("openai", ["rs_openai"]), ("copilot", [])):
        request = ChatRequest(messages=[Message("user", "q"), turn(issuer), Message("user", "again")],
                              max_tokens=100)
        body = ResponsesWire("openai").build_body(request, "gpt-5")
        ids = [i["id"] for i in body["input"] if i.get("type") == "reasoning"]
        assert ids == expected, issuer
