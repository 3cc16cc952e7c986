"""The contract every adapter honours, run against each provider's wire-protocol fake.

Same calls, same ``Response``, same errors — whatever the provider. A new provider passes this file
by adding one ``Target`` in ``targets.py``. Every case runs twice: as the fake sends it, and with
its replies gzip-compressed (real servers compress event streams when the client accepts it).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from dispatch_nb import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    CancelToken,
    DispatchError,
    Message,
    ModelUnavailableError,
    RateLimitError,
    RequestCancelled,
    RequestError,
    Response,
    ServerError,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

from ..fakes.provider import (
    CREDENTIAL_HEADERS,
    WEATHER,
    Drop,
    Fail,
    ProviderFake,
    Stall,
    ToolCall,
    Turn,
)
from .targets import TARGETS, Target, only


@pytest.fixture(params=[None, "gzip"], ids=["plain", "gzip"])
def fake(fake: ProviderFake, request: pytest.FixtureRequest) -> ProviderFake:
    """The target's fake (conftest.py), replying as it does and gzip-compressed."""
    fake.server.compress = request.param
    return fake


def _same(a: Response, b: Response) -> None:
    assert a.content == b.content
    assert a.tool_calls == b.tool_calls
    assert a.stop_reason == b.stop_reason
    assert a.usage == b.usage


# -- replies -------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_text_reply(make: Any, fake: ProviderFake, target: Target, stream: bool) -> None:
    fake.push(Turn(text="Hello there, how can I help?", input_tokens=11, output_tokens=6))
    response = make().chat("Hi", stream=stream)
    assert isinstance(response.content, list)
    assert response.text == "Hello there, how can I help?"
    assert [b.type for b in response.content] == ["text"]
    assert response.tool_calls == []
    assert response.stop_reason == "end_turn"
    if target.reports_usage:
        assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 6)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_tool_call_reply(make: Any, fake: ProviderFake, stream: bool) -> None:
    fake.push(Turn(tool_calls=[ToolCall("call_1", "get_weather", {"city": "Paris"})]))
    response = make().chat("Weather in Paris?", tools=[WEATHER], stream=stream)
    assert response.stop_reason == "tool_use"
    assert response.text == ""
    assert len(response.tool_calls) == 1
    call = response.tool_calls[0]
    assert (call.id, call.name, call.arguments) == ("call_1", "get_weather", {"city": "Paris"})
    assert response.content[-1] == call
    assert fake.tool_names_of(fake.last_request) == ["get_weather"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_text_and_tool_calls_in_order(make: Any, fake: ProviderFake, stream: bool) -> None:
    fake.push(
        Turn(
            text="Let me check both.",
            tool_calls=[
                ToolCall("call_a", "get_weather", {"city": "Paris"}),
                ToolCall("call_b", "get_weather", {"city": "Oslo"}),
            ],
        )
    )
    response = make().chat("Paris and Oslo?", tools=[WEATHER.model_dump()], stream=stream)
    assert [b.type for b in response.content] == ["text", "tool_use", "tool_use"]
    assert response.text == "Let me check both."
    assert [c.arguments["city"] for c in response.tool_calls] == ["Paris", "Oslo"]
    assert [c.id for c in response.tool_calls] == ["call_a", "call_b"]


def test_system_prompt_placement(make: Any, fake: ProviderFake) -> None:
    make().chat("Hi", system="You are terse.")
    assert fake.system_of(fake.last_request) == "You are terse."
    make().chat("Hi")
    assert fake.system_of(fake.last_request) is None


def test_per_call_max_tokens_beats_constructor_default(make: Any, fake: ProviderFake) -> None:
    adapter = make(max_tokens=300)
    adapter.chat("Hi")
    assert fake.max_tokens_of(fake.last_request) == 300
    adapter.chat("Hi", max_tokens=17)
    assert fake.max_tokens_of(fake.last_request) == 17


def test_streaming_deltas_and_same_response(make: Any, fake: ProviderFake) -> None:
    turn = Turn(
        text="Sure: checking.",
        tool_calls=[ToolCall("call_9", "get_weather", {"city": "Lima"})],
        chunk=3,
    )
    fake.push(turn, turn)
    adapter = make()
    with adapter.stream("Lima?", tools=[WEATHER]) as stream:
        deltas = list(stream)
    streamed = stream.response
    plain = adapter.chat("Lima?", tools=[WEATHER])
    _same(streamed, plain)

    text = "".join(d.text or "" for d in deltas if d.type == "text_delta")
    assert text == "Sure: checking."
    assert sum(d.type == "text_delta" for d in deltas) >= 2
    kinds = [d.type for d in deltas if d.type.startswith("tool_use")]
    assert kinds[0] == "tool_use_start" and kinds[-1] == "tool_use_end"
    start = next(d for d in deltas if d.type == "tool_use_start")
    assert (start.tool_call_id, start.tool_name) == ("call_9", "get_weather")
    end = next(d for d in deltas if d.type == "tool_use_end")
    assert end.arguments == {"city": "Lima"}
    args = "".join(d.argument_delta or "" for d in deltas if d.type == "tool_use_delta")
    assert args.replace(" ", "") == '{"city":"Lima"}'


def test_on_delta_sees_every_delta(make: Any, fake: ProviderFake) -> None:
    fake.push(Turn(text="abcdefghij", chunk=2))
    seen: list[str] = []
    response = make().chat("x", stream=True, on_delta=lambda d: seen.append(d.text or ""))
    assert "".join(seen) == response.text == "abcdefghij"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_to_message_round_trip_accepted(make: Any, fake: ProviderFake, stream: bool) -> None:
    fake.push(
        Turn(text="Checking.", tool_calls=[ToolCall("call_7", "get_weather", {"city": "Rome"})]),
        Turn(text="It is 21 °C in Rome."),
    )
    adapter = make()
    history: list[Message] = [Message(role="user", content="Weather in Rome?")]
    first = adapter.chat(history, tools=[WEATHER], stream=stream)
    history.append(first.to_message())
    history.append(
        Message(role="user", content=[ToolResultBlock(tool_use_id="call_7", content="21 °C")])
    )
    second = adapter.chat(history, tools=[WEATHER], stream=stream)
    assert second.text == "It is 21 °C in Rome."
    assert fake.tool_result_ids_of(fake.last_request) == ["call_7"]


def test_response_json_round_trip(make: Any, fake: ProviderFake) -> None:
    fake.push(Turn(text="Hi", tool_calls=[ToolCall("call_1", "get_weather", {"city": "Oslo"})]))
    response = make().chat("x", tools=[WEATHER], stream=True)
    assert Response.model_validate_json(response.model_dump_json()) == response


# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, RequestError),
        (401, AuthenticationError),
        (403, AuthenticationError),
        (404, RequestError),
        (429, RateLimitError),
        (500, ServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_http_error_mapping(
    make: Any, fake: ProviderFake, status: int, error_class: type, stream: bool
) -> None:
    headers = {"retry-after": "7"} if status == 429 else {}
    fake.push(Fail(status, "nope", headers=headers))
    with pytest.raises(error_class) as info:
        make().chat("x", stream=stream)
    err = info.value
    assert err.status_code == status
    assert err.provider
    assert err.message
    if status == 429:
        assert err.retry_after == 7


#: the targets whose requests carry a credential (the others' servers take none: a local server)
CREDENTIALED = [t for t in TARGETS
                if t.name not in ("fake", "openai-compatible-llama", "compatible-mistral")]


@only(CREDENTIALED)
@pytest.mark.parametrize("where", ["http", "stream"])
def test_a_credential_the_server_echoes_never_reaches_the_error(
    make: Any, fake: ProviderFake, where: str
) -> None:
    """A gateway quoting the ``Authorization`` header it got, in an HTTP error or an error event
    in the stream: the key is ``[REDACTED]`` in the message, ``str``, ``repr`` and ``args``."""
    if where == "http":
        fake.push(Fail(400, "bad request; you sent {credentials}"))
    else:
        fake.push(Turn(text="abcd", chunk=2, error_after=1,
                       error=Fail(529, "overloaded; you sent {credentials}", "overloaded_error")))
    with pytest.raises(DispatchError) as info:
        make().chat("x", stream=where == "stream")
    headers = fake.requests[-1].headers
    sent = [headers[n] for n in CREDENTIAL_HEADERS if n in headers]
    assert sent, "this target's request carries no credential: leave it out of CREDENTIALED"
    secrets = {v.split(" ", 1)[-1] for v in sent}
    err = info.value
    assert err.code == ("invalid_request" if where == "http" else "server_error"), err
    shown = " ".join([err.message, str(err), repr(err), *map(str, err.args)])
    assert "you sent" in err.message and "[REDACTED]" in err.message, err.message
    for secret in secrets:
        assert secret not in shown, shown


def test_a_missing_model_is_named_when_the_server_does_not_name_it(
    make: Any, fake: ProviderFake
) -> None:
    fake.push(Fail(404, "model not found", "not_found_error"))
    adapter = make()
    with pytest.raises(ModelUnavailableError) as info:
        adapter.chat("x")
    assert info.value.code == "model_unavailable" and adapter.model_name in str(info.value)
    named = f"The model `{adapter.model_name}` does not exist"
    fake.push(Fail(404, named, "not_found_error"))
    with pytest.raises(ModelUnavailableError) as info:
        adapter.chat("x")
    assert info.value.code == "model_unavailable"
    assert info.value.message.startswith(named) and "[model" not in info.value.message  # once


def test_connection_refused(make: Any, fake: ProviderFake) -> None:
    adapter = make()
    fake.close()  # the port is now closed: connecting is refused
    with pytest.raises(APIConnectionError) as info:
        adapter.chat("x")
    assert info.value.code == "network_error"
    assert isinstance(info.value, ConnectionError)


def test_dropped_connection(make: Any, fake: ProviderFake) -> None:
    fake.push(Drop())
    with pytest.raises(APIConnectionError) as info:
        make().chat("x", stream=True)
    assert info.value.code == "network_error"


def test_timeout_is_a_total_deadline(make: Any, fake: ProviderFake) -> None:
    fake.push(Stall(3.0))
    with pytest.raises(APITimeoutError) as info:
        make().chat("x", stream=True, timeout=0.4)
    assert info.value.code == "timeout"
    assert isinstance(info.value, TimeoutError)
    assert "0.4" in info.value.message


def test_timeout_mid_stream_keeps_partial(make: Any, fake: ProviderFake) -> None:
    fake.push(Turn(text="abcdefghijklmnop", chunk=2, stall_after=3, stall=3.0))
    with pytest.raises(APITimeoutError) as info:
        make().chat("x", stream=True, timeout=0.5)
    assert info.value.code == "timeout"
    assert info.value.partial is not None
    assert info.value.partial.text.startswith("ab")


def test_cancel_mid_stream_keeps_partial(make: Any, fake: ProviderFake) -> None:
    fake.push(Turn(text="x" * 400, chunk=2, delay=0.02))
    token = CancelToken()
    adapter = make()
    seen: list[str] = []

    def on_delta(d: Any) -> None:
        seen.append(d.text or "")
        if len(seen) == 3:
            threading.Timer(0.05, token.cancel).start()

    with pytest.raises(RequestCancelled) as info:
        adapter.chat("x", stream=True, on_delta=on_delta, cancel=token)
    assert info.value.code == "cancelled"
    partial = info.value.partial
    assert partial is not None
    assert partial.text == "".join(seen)
    assert 6 <= len(partial.text) < 400


#: the status an in-stream "overloaded" error reports: the one the event carries, or 500 where the
#: protocol's error events carry none (OpenAI's)
#: an in-stream error event carries no HTTP status on these wire formats: the adapter says 500
IN_STREAM_OVERLOAD_STATUS = {"openai-responses": 500, "openai-compatible": 500, "copilot": 500,
                             "copilot-responses": 500, "compatible-mistral": 500}


def test_in_stream_error_keeps_partial(make: Any, fake: ProviderFake, target: Target) -> None:
    fake.push(Turn(text="abcdefgh", chunk=2, error_after=2,
                   error=Fail(529, "Overloaded", "overloaded_error")))
    with pytest.raises(ServerError) as info:
        make().chat("x", stream=True)
    status = IN_STREAM_OVERLOAD_STATUS.get(target.name, 529)
    assert (info.value.status_code, info.value.code) == (status, "server_error")
    assert info.value.partial is not None
    assert info.value.partial.text == "abcd"


def test_close_ends_the_stream(make: Any, fake: ProviderFake) -> None:
    fake.push(Turn(text="y" * 200, chunk=1, delay=0.01))
    stream = make().stream("x")
    first = next(iter(stream))
    assert first.type == "text_delta"
    stream.close()
    assert list(stream) == []
    assert stream.partial.text.startswith("y")


# -- async twins ---------------------------------------------------------------------------------
def test_async_chat_and_stream(make: Any, fake: ProviderFake) -> None:
    fake.push(Turn(text="async hello", chunk=3), Turn(text="async hello", chunk=3))
    adapter = make()

    async def main() -> tuple[Response, Response, list[str]]:
        plain = await adapter.achat("x")
        texts: list[str] = []
        async with adapter.astream("x") as stream:
            async for delta in stream:
                texts.append(delta.text or "")
        return plain, stream.response, texts

    plain, streamed, texts = asyncio.run(main())
    _same(plain, streamed)
    assert "".join(texts) == "async hello"


def test_async_cancel_and_errors(make: Any, fake: ProviderFake) -> None:
    fake.push(Fail(401, "bad key"), Turn(text="z" * 300, chunk=1, delay=0.01))
    adapter = make()

    async def main() -> RequestCancelled:
        with pytest.raises(AuthenticationError) as raised:
            await adapter.achat("x")
        assert (raised.value.status_code, raised.value.code) == (401, "authentication_failed")
        token = CancelToken()

        def cancel_at_the_first_text(delta: Any) -> None:
            if delta.text:
                token.cancel()

        with pytest.raises(RequestCancelled) as info:
            await adapter.achat("x", stream=True, cancel=token, on_delta=cancel_at_the_first_text)
        assert info.value.code == "cancelled"
        return info.value

    err = asyncio.run(main())
    assert err.partial is not None and 0 < len(err.partial.text) < 300


def test_text_block_and_tool_use_types(make: Any, fake: ProviderFake) -> None:
    fake.push(Turn(text="t", tool_calls=[ToolCall("c1", "get_weather", {"city": "A"})]))
    response = make().chat("x", tools=[WEATHER])
    assert isinstance(response.content[0], TextBlock)
    assert isinstance(response.content[1], ToolUseBlock)
