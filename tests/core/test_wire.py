"""Wire formats as objects (``dispatch_nb.wire``): a frozen quirk description shapes the body, a
request carries the wire format it was built for, and the HTTP layer reads each answer with the
parser of *that* format. Plus the adapter seams: public names, former private names still working."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from dispatch_nb import Message, TextBlock, ThinkingBlock
from dispatch_nb.adapter import Adapter, ChatRequest
from dispatch_nb.call_control import CallControl
from dispatch_nb.errors import error_for_status
from dispatch_nb.http_adapter import HTTPAdapter, WireRequest
from dispatch_nb.providers.copilot import COPILOT_CHAT_QUIRKS, CopilotAdapter
from dispatch_nb.providers.openai import OpenAIAdapter
from dispatch_nb.stream import Accumulator
from dispatch_nb.structured import as_output
from dispatch_nb.testing import CanonicalHandler, Turn
from dispatch_nb.types import StreamDelta, as_messages
from dispatch_nb.wire import (
    CanonicalWire,
    ChatCompletionsWire,
    ChatQuirks,
    MessagesQuirks,
    MessagesWire,
    ResponsesQuirks,
    ResponsesWire,
    WireFormat,
)

from ..fakes.openai_schema import problems


class City(BaseModel):
    name: str


def request(text: str = "hi", *, stream: bool = True, **fields: Any) -> ChatRequest:
    return ChatRequest(messages=as_messages(text), stream=stream, max_tokens=64, **fields)


# -- a quirk description changes the body ---------------------------------------------------------
def test_chat_quirks_change_the_body_and_it_still_conforms_to_openais_spec() -> None:
    plain = ChatCompletionsWire("compatible").build_body(request(), "m")
    assert plain["max_tokens"] == 64 and "max_completion_tokens" not in plain
    assert plain["stream_options"] == {"include_usage": True}

    quirky = ChatCompletionsWire(
        "openai", ChatQuirks(max_tokens_field="max_completion_tokens", include_usage=False)
    ).build_body(request(), "o3")
    assert quirky["max_completion_tokens"] == 64 and "max_tokens" not in quirky
    assert "stream_options" not in quirky
    for body in (plain, quirky):
        assert problems("/chat/completions", body) is None


def test_the_json_object_quirk_changes_how_structured_output_goes() -> None:
    call = request(output=as_output(City))
    wire = ChatCompletionsWire("compatible")
    schema_format = wire.build_body(call, "m", output_mode=wire.native_output)["response_format"]
    assert schema_format["type"] == "json_schema"
    assert problems("/chat/completions", wire.build_body(call, "m", output_mode="response_format")) is None

    llama = wire.with_quirks(schema_in_json_object=True)
    assert llama.native_output == "json_object" and wire.native_output == "response_format"
    sent = llama.build_body(call, "m", output_mode=llama.native_output)["response_format"]
    assert sent["type"] == "json_object" and sent["schema"]["properties"]["name"]["type"] == "string"


def test_reasoning_is_echoed_only_with_the_echo_quirk_and_only_for_its_provider() -> None:
    mine = ThinkingBlock(thinking="think", signature="opaque",
                         provider_data={"openai_chat": {"field": "reasoning_text",
                                                        "provider": "copilot"}})
    theirs = ThinkingBlock(thinking="other", signature="sig",
                           provider_data={"openai_chat": {"field": "reasoning_text"}})
    history = [Message(role="user", content="q"),
               Message(role="assistant", content=[mine, theirs, TextBlock(text="a")]),
               Message(role="user", content="more")]
    call = ChatRequest(messages=history, max_tokens=64)
    plain = ChatCompletionsWire("compatible").build_body(call, "m")["messages"][1]
    assert "reasoning_text" not in plain and "reasoning_opaque" not in plain
    copilot = ChatCompletionsWire("copilot", COPILOT_CHAT_QUIRKS).build_body(call, "m")
    assert copilot["messages"][1]["reasoning_text"] == "think"
    assert copilot["messages"][1]["reasoning_opaque"] == "opaque"


def test_responses_and_messages_quirks_change_their_bodies() -> None:
    auto = ResponsesWire("openai").build_body(request(), "gpt-4.1")
    forced = ResponsesWire("openai", ResponsesQuirks(encrypted_reasoning=True)).build_body(
        request(), "gpt-4.1")
    assert "include" not in auto
    assert forced["include"] == ["reasoning.encrypted_content"]
    for body in (auto, forced):
        assert problems("/responses", body) is None

    no_max = dataclasses.replace(request(), max_tokens=None)
    assert MessagesWire().build_body(no_max, "claude-x")["max_tokens"] == 4096
    small = MessagesWire("anthropic", MessagesQuirks(default_max_tokens=100, pass_through=()))
    body = small.build_body(dataclasses.replace(no_max, options={"top_k": 5}), "claude-x")
    assert body["max_tokens"] == 100 and "top_k" not in body
    assert MessagesWire().build_body(dataclasses.replace(no_max, options={"top_k": 5}),
                                     "claude-x")["top_k"] == 5


def test_wire_formats_and_quirks_are_frozen() -> None:
    wire = ChatCompletionsWire("compatible")
    with pytest.raises(dataclasses.FrozenInstanceError):
        wire.quirks = ChatQuirks(include_usage=False)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        wire.quirks.include_usage = False  # type: ignore[misc]
    changed = wire.with_quirks(include_usage=False)
    assert changed is not wire and wire.quirks.include_usage and not changed.quirks.include_usage
    formats: list[WireFormat] = [wire, ResponsesWire("openai"), MessagesWire(), CanonicalWire()]
    assert [(w.name, w.path) for w in formats] == [
        ("chat.completions", "chat/completions"), ("responses", "responses"),
        ("messages", "v1/messages"), ("canonical", "chat")]


# -- a request carries its wire format; its parser reads the answer -------------------------------
def test_a_request_carries_the_wire_format_it_was_built_with() -> None:
    wire = ChatCompletionsWire("compatible")
    built = wire.wire_request(request(), "m", headers={"x-a": "1"})
    assert built.wire is wire and (built.method, built.url) == ("POST", "chat/completions")
    assert built.headers == {"x-a": "1"} and built.json["model"] == "m"
    assert isinstance(wire.stream_parser(Accumulator("m")), type(built.wire.stream_parser(
        Accumulator("m"))))

    official = OpenAIAdapter("gpt-4.1", api_key="k")
    compatible = OpenAIAdapter("llama", backend="compatible")
    assert isinstance(official.build_request(request()).wire, ResponsesWire)
    assert isinstance(compatible.build_request(request()).wire, ChatCompletionsWire)
    assert (official.backend_mode, compatible.backend_mode) == ("official", "compatible")


def test_copilot_picks_a_wire_format_per_model_and_each_request_names_its_own() -> None:
    chat = CopilotAdapter("gpt-4.1", github_token="gho_x")
    codex = CopilotAdapter("gpt-5-codex", github_token="gho_x")
    chat_request = chat.build_request(request())
    codex_request = codex.build_request(request())
    assert isinstance(chat_request.wire, ChatCompletionsWire)
    assert chat_request.wire.quirks == COPILOT_CHAT_QUIRKS and chat_request.url == "chat/completions"
    assert isinstance(codex_request.wire, ResponsesWire) and codex_request.url == "responses"
    assert codex_request.wire.provider == "copilot"
    assert chat_request.headers["x-initiator"] == "user"


def test_a_learned_quirk_gives_a_new_wire_format_and_older_requests_keep_theirs() -> None:
    adapter = OpenAIAdapter("llama", backend="compatible")
    call = request(output=as_output(City))
    before = adapter.build_request(call)
    error = error_for_status(
        500, "Input should be 'text' or 'json_object' for response_format.type", provider="compatible")
    assert adapter.should_retry_now(error) is True
    after = adapter.build_request(call)
    assert before.json["response_format"]["type"] == "json_schema"
    assert after.json["response_format"]["type"] == "json_object"
    # the learned format is the request's; the adapter's own wire (shared by every thread using
    # the adapter) is never replaced
    assert before.wire is not after.wire and before.wire is adapter.wire
    assert adapter.should_retry_now(error) is False  # learned once


class SaysOneFormatSpeaksAnother(HTTPAdapter):
    """An adapter whose own ``wire`` is chat.completions but whose requests are canonical: the
    answer must be read with the request's format (chat.completions' parser cannot read it)."""

    wire = ChatCompletionsWire("test")

    def __init__(self, handler: CanonicalHandler) -> None:
        transport = httpx.MockTransport(handler)
        super().__init__(base_url="http://wire.test",
                         async_http_client=httpx.AsyncClient(transport=transport))

    @property
    def model_name(self) -> str:
        return "echo"

    def build_request(self, request: ChatRequest) -> WireRequest:
        return CanonicalWire("test").wire_request(request, self.model_name)


@pytest.mark.parametrize("stream", [True, False])
def test_the_http_layer_reads_the_answer_with_the_requests_wire_format(stream: bool) -> None:
    handler = CanonicalHandler(Turn(text="read by the canonical parser", chunk=5))
    adapter = SaysOneFormatSpeaksAnother(handler)
    assert adapter.chat("hi", stream=stream).text == "read by the canonical parser"
    assert handler.last_body["model"] == "echo"


async def test_the_async_path_reads_with_the_requests_wire_format_too() -> None:
    handler = CanonicalHandler(Turn(text="async and canonical"))
    adapter = SaysOneFormatSpeaksAnother(handler)
    assert (await adapter.achat("hi", stream=True)).text == "async and canonical"


def test_an_http_adapter_without_a_wire_format_says_which_seam_is_missing() -> None:
    class Bare(HTTPAdapter):
        @property
        def model_name(self) -> str:
            return "m"

    with pytest.raises(NotImplementedError, match="must set wire"):
        Bare(base_url="http://x.test").build_request(request())


@pytest.mark.parametrize("stream", [True, False])
def test_reading_an_answer_without_a_wire_format_names_the_read_not_build_request(stream: bool) -> None:
    class BuildsItsOwn(HTTPAdapter):
        @property
        def model_name(self) -> str:
            return "echo"

        def build_request(self, request: ChatRequest) -> WireRequest:
            return WireRequest("POST", "/chat", json={"model": "echo", "stream": request.stream,
                                                      "messages": [{"role": "user", "content": "hi"}]})

    handler = CanonicalHandler(Turn(text="unread"))
    adapter = BuildsItsOwn(base_url="http://wire.test",
                           async_http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(NotImplementedError, match="cannot read the answer") as info:
        adapter.chat("hi", stream=stream)
    assert "implement build_request" not in str(info.value)


# -- the adapter seams ----------------------------------------------------------------------------
class NewStyle(Adapter):
    @property
    def model_name(self) -> str:
        return "new"

    def stream_once(self, request: ChatRequest, acc: Accumulator,
                    control: CallControl) -> Iterator[StreamDelta]:
        yield acc.text("new seam")
        acc.stop_reason = "end_turn"


class Wrapper(NewStyle):
    """Overrides the wrapper seam and calls the base through it."""

    opened = 0

    def open_stream(self, request: ChatRequest, timeout: float | None, cancel: Any) -> Any:
        Wrapper.opened += 1
        return super().open_stream(request, timeout, cancel)


async def test_the_public_seams_are_the_ones_called() -> None:
    assert NewStyle().chat("x", stream=True).text == "new seam"
    assert (await NewStyle().achat("x", stream=True)).text == "new seam"
    assert Wrapper().chat("x").text == "new seam" and Wrapper.opened == 1


def test_the_former_module_paths_still_give_the_same_objects() -> None:
    from dispatch_nb.providers import copilot, copilot_errors, copilot_models

    assert copilot.copilot_error is copilot_errors.copilot_error
    assert copilot.copilot_model_info is copilot_models.copilot_model_info
    assert copilot.copilot_endpoint(None, "gpt-5-codex") == "responses"


def test_post_json_is_the_public_seam_for_side_requests() -> None:
    import socket

    from dispatch_nb.errors import APIConnectionError
    from dispatch_nb.providers.anthropic import AnthropicAdapter

    handler = CanonicalHandler()
    adapter = SaysOneFormatSpeaksAnother(handler)
    answer = adapter.post_json("chat", {"model": "m", "messages": [], "stream": False},
                               headers={"x-extra": "1"})
    assert answer.status_code == 200 and answer.json()["model"] == "m"
    assert handler.requests[-1].headers["content-type"] == "application/json"
    assert handler.requests[-1].headers["x-extra"] == "1"
    missing = adapter.post_json("nowhere", {})
    assert missing.status_code == 404  # any status comes back; parse_error reads it

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = AnthropicAdapter("claude-x", api_key="k", base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(APIConnectionError) as info:
        down.post_json("v1/messages/count_tokens", {})
    assert info.value.code == "network_error"
    assert down.count_tokens("hi") == -1  # the server cannot count: -1, as before
    assert down.fixed_headers["anthropic-version"] == "2023-06-01"
    down.close()


def test_merge_delta_leaves_the_block_it_was_copied_from_alone() -> None:
    from dispatch_nb.wire.base import merge_delta

    first = {"type": "x", "items": [1], "meta": {"a": 1}, "text": "a"}
    merged = dict(first)
    merge_delta(merged, {"type": "x", "items": [2], "meta": {"b": 2}, "text": "b"})
    merge_delta(merged, {"items": 3})
    assert merged == {"type": "x", "items": [1, 2, 3], "meta": {"a": 1, "b": 2}, "text": "ab"}
    assert first == {"type": "x", "items": [1], "meta": {"a": 1}, "text": "a"}  # a snapshot's own
