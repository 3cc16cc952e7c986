"""Structured output (``output=``): one contract, run against every provider's wire-protocol fake.

Same types in, same parsed objects out — whatever the provider and whichever native mechanism it
uses (``text.format``, ``response_format``, llama-cpp-python's ``json_object`` + schema,
Anthropic's ``output_config`` or a forced tool, the canonical protocol's ``output``). The fakes
refuse what the real APIs refuse about structured requests (tests/fakes/structured.py: OpenAI's
strict-schema rules, Anthropic's schema rules, llama-cpp-python's ``response_format`` types), and
every OpenAI request body is also checked against the published OpenAPI spec.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from typing import Any, Literal

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from dispatch_nb import (
    OutputValidationError,
    Session,
    StructuredOutput,
    StructuredResponseStream,
    tool,
)
from dispatch_nb.adapter import Adapter
from dispatch_nb.structured import OUTPUT_TOOL_NAME

from ..fakes.openai_schema import SPEC, problems
from ..fakes.provider import ProviderFake, ToolCall, Turn
from ..fakes.structured import mechanism_of, requested_schema
from .targets import TARGETS, Target, _copilot_adapter, _copilot_fake, target_fixture


def _anthropic_tool_adapter(fake: ProviderFake, **kw: Any) -> Adapter:
    from dispatch_nb.providers.anthropic import AnthropicAdapter

    return AnthropicAdapter("claude-3-5-haiku-20241022", api_key="sk-ant-test",
                            base_url=fake.base_url, **kw)


def _anthropic_fake() -> ProviderFake:
    from ..fakes.anthropic import AnthropicFake

    return AnthropicFake()


STRUCTURED_TARGETS: list[Target] = [
    *TARGETS,
    # a model without output_config: the answer comes as a forced tool's input
    Target("anthropic-tool", _anthropic_fake, _anthropic_tool_adapter),
    # one of Copilot's OpenAI models on /chat/completions: response_format json_schema
    Target("copilot-gpt", _copilot_fake, _copilot_adapter("gpt-4.1")),
]

#: the mechanism each target must use (and log as output=...)
MECHANISM = {
    "fake": "canonical",
    "anthropic": "output_config",
    "anthropic-tool": "tool",
    "openai-responses": "text.format",
    "openai-compatible": "response_format",
    "openai-compatible-llama": "json_object",  # after the server refused json_schema (422)
    "compatible-mistral": "response_format",  # Mistral documents response_format json_schema
    "copilot": "tool",  # Claude on Copilot's chat.completions
    "copilot-responses": "text.format",
    "copilot-gpt": "response_format",
    # a target added later says its own (Target.structured_mechanism)
    **{t.name: t.structured_mechanism for t in TARGETS if t.structured_mechanism},
}


# -- the types ---------------------------------------------------------------------------------------
class Sentiment(str, enum.Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"
    NEUTRAL = "neutral"


class Mention(BaseModel):
    name: str
    kind: Literal["person", "place", "organisation"]
    salience: float | None = None


class Extraction(BaseModel):
    """What a short text says: a summary, its sentiment, who and what it mentions."""

    summary: str
    sentiment: Sentiment
    mentions: list[Mention]
    language: str = "en"


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    label: str
    corners: list[int]


CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}

EXTRACTION_JSON = {
    "summary": "Ada met Grace in Paris.",
    "sentiment": "positive",
    "mentions": [
        {"name": "Ada", "kind": "person", "salience": 0.9},
        {"name": "Paris", "kind": "place", "salience": None},
    ],
    "language": None,  # a strict schema lets the model send null here: the default applies
}
EXTRACTION = Extraction(
    summary="Ada met Grace in Paris.",
    sentiment=Sentiment.POSITIVE,
    mentions=[Mention(name="Ada", kind="person", salience=0.9), Mention(name="Paris", kind="place")],
)

#: (output=, what the model writes, the parsed value)
CASES: dict[str, tuple[Any, Any, Any]] = {
    "model": (Extraction, EXTRACTION_JSON, EXTRACTION),
    "list-of-models": (
        list[Mention],
        {"result": [{"name": "Oslo", "kind": "place"}, {"name": "IBM", "kind": "organisation"}]},
        [Mention(name="Oslo", kind="place"), Mention(name="IBM", kind="organisation")],
    ),
    "typed-dict": (Point, {"x": 3, "y": -4}, {"x": 3, "y": -4}),
    "dataclass": (Box, {"label": "crate", "corners": [1, 2, 3, 4]}, Box("crate", [1, 2, 3, 4])),
    "literal": (Literal["yes", "no"], {"result": "no"}, "no"),
    "schema-dict": (CITY_SCHEMA, {"city": "Lyon", "population": 522000},
                    {"city": "Lyon", "population": 522000}),
    "schema-dict-array": ({"type": "array", "items": {"type": "string"}},
                          {"result": ["a", "b"]}, ["a", "b"]),
}


# -- fixtures ------------------------------------------------------------------------------------------
target = target_fixture(STRUCTURED_TARGETS)  # fake and adapter: conftest.py


def _answers(fake: ProviderFake, target: Target) -> list[Any]:
    """The structured requests the fake answered (llama-cpp-python's refused first try left out)."""
    return [r for r in fake.chat_requests if mechanism_of(r.json) == MECHANISM[target.name]]


def _check_openai_bodies(fake: ProviderFake, target: Target) -> None:
    if not target.name.startswith("openai") or not SPEC.is_file():
        return
    for request in fake.chat_requests:
        endpoint = "/responses" if request.path.endswith("/responses") else "/chat/completions"
        problem = problems(endpoint, request.json)
        assert problem is None, problem


def _log_modes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().rsplit("output=", 1)[1] for r in caplog.records
            if r.getMessage().startswith("request provider=") and "output=" in r.getMessage()]


# -- same types in, same objects out --------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_same_types_in_same_objects_out(
    adapter: Adapter, fake: ProviderFake, target: Target, case: str, stream: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    output, answer, expected = CASES[case]
    fake.push(Turn(text=json.dumps(answer), input_tokens=20, output_tokens=9))
    with caplog.at_level(logging.INFO, logger="dispatch_nb"):
        response = adapter.chat("Extract.", output=output, stream=stream)
    assert response.parsed == expected
    assert type(response.parsed) is type(expected)
    assert json.loads(response.text) == json.loads(json.dumps(answer))  # the raw JSON
    assert response.tool_calls == [] and response.stop_reason == "end_turn"
    if target.reports_usage:
        assert (response.usage.input_tokens, response.usage.output_tokens) == (20, 9)
    [asked] = _answers(fake, target)
    assert requested_schema(asked.json) is not None
    assert _log_modes(caplog)[-1] == MECHANISM[target.name]
    _check_openai_bodies(fake, target)


def test_stream_grows_a_partial_object(adapter: Adapter, fake: ProviderFake, target: Target) -> None:
    fake.push(Turn(text=json.dumps(EXTRACTION_JSON), chunk=7))
    with adapter.stream("Extract.", output=Extraction) as stream:
        assert isinstance(stream, StructuredResponseStream)
        seen: list[Any] = []
        text = ""
        for delta in stream:
            assert delta.type == "text_delta"  # tool-mode argument fragments arrive as text too
            text += delta.text or ""
            seen.append(stream.partial_parsed)
    response = stream.response
    assert response.parsed == EXTRACTION
    assert text == response.text
    grown = [p for p in seen if isinstance(p, dict)]
    assert grown and grown[0] != grown[-1]
    assert any(p.get("mentions") and p["mentions"][0].get("name") for p in grown)
    assert stream.partial_parsed == EXTRACTION  # the validated object once finished
    assert stream.attempt == 1


async def test_async_twins(adapter: Adapter, fake: ProviderFake) -> None:
    answer = json.dumps(EXTRACTION_JSON)
    fake.push(Turn(text=answer), Turn(text=answer))
    response = await adapter.achat("Extract.", output=Extraction, stream=True)
    assert response.parsed == EXTRACTION
    async with adapter.astream("Extract.", output=Extraction) as stream:
        partials = [stream.partial_parsed async for _ in stream]
    assert stream.response.parsed == EXTRACTION
    assert any(isinstance(p, dict) for p in partials)


# -- validation, retries, errors ---------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_invalid_answer_is_sent_back_and_retried(
    adapter: Adapter, fake: ProviderFake, target: Target, stream: bool
) -> None:
    bad = {**EXTRACTION_JSON, "sentiment": "ecstatic"}
    fake.push(Turn(text=json.dumps(bad), input_tokens=20, output_tokens=9),
              Turn(text=json.dumps(EXTRACTION_JSON), input_tokens=40, output_tokens=9))
    response = adapter.chat("Extract.", output=Extraction, stream=stream)
    assert response.parsed == EXTRACTION
    if target.reports_usage:  # both attempts are counted
        assert (response.usage.input_tokens, response.usage.output_tokens) == (60, 18)
    first, second = _answers(fake, target)
    sent = json.dumps(second.json)
    assert "does not match the required JSON schema" in sent and "sentiment" in sent
    assert "ecstatic" in sent  # the model sees what it wrote
    assert "does not match" not in json.dumps(first.json)
    _check_openai_bodies(fake, target)


def test_output_retries_zero_raises_with_text_errors_partial(
    adapter: Adapter, fake: ProviderFake, target: Target
) -> None:
    bad = {**EXTRACTION_JSON, "mentions": [{"name": "Ada", "kind": "robot"}]}
    fake.push(Turn(text=json.dumps(bad), input_tokens=20, output_tokens=9))
    with pytest.raises(OutputValidationError) as info:
        adapter.chat("Extract.", output=Extraction, output_retries=0)
    err = info.value
    assert err.code == "output_invalid" and err.attempts == 1 and err.status_code is None
    assert json.loads(err.text) == bad
    assert [e["loc"] for e in err.errors] == [("mentions", 0, "kind")]
    assert err.partial is not None and err.partial.text == err.text
    assert err.partial.parsed is None
    if target.reports_usage:
        assert err.partial.usage.output_tokens == 9
    assert "mentions.0.kind" in str(err)
    assert len(_answers(fake, target)) == 1


def test_invalid_json_after_every_retry(adapter: Adapter, fake: ProviderFake, target: Target) -> None:
    fake.push(Turn(text="Sure! Here it is: {oops"), Turn(text="{still not json"),
              Turn(text="nor this"))
    with pytest.raises(OutputValidationError) as info:
        adapter.chat("Extract.", output=Extraction, output_retries=2)
    assert info.value.code == "output_invalid"
    err = info.value
    assert err.attempts == 3 and "after 3 attempts" in err.message
    # (a tool's input always arrives as an object: unparsable arguments come as {} there)
    assert err.errors[0]["type"] == ("missing" if MECHANISM[target.name] == "tool" and
                                     "copilot" not in target.name else "json_invalid")
    assert len(_answers(fake, target)) == 3


def test_answer_cut_off_at_max_tokens(adapter: Adapter, fake: ProviderFake, target: Target) -> None:
    fake.push(Turn(text='{"summary": "Ada met', stop_reason="max_tokens"))
    with pytest.raises(OutputValidationError) as info:
        adapter.chat("Extract.", output=Extraction, stream=True)
    assert info.value.code == "output_truncated"
    assert "max_tokens" in info.value.message
    assert len(_answers(fake, target)) == 1  # a longer answer will not fit either: no retry


def test_refusal_is_a_clear_error(adapter: Adapter, fake: ProviderFake, target: Target) -> None:
    fake.push(Turn(text="I can't help with that request.", stop_reason="refusal"))
    with pytest.raises(OutputValidationError) as info:
        adapter.chat("Extract.", output=Extraction)
    err = info.value
    assert err.code == "output_refused"
    assert "refused" in err.message and "I can't help with that request." in err.message
    assert err.text == "I can't help with that request."
    assert len(_answers(fake, target)) == 1


# -- tools and structured output together ---------------------------------------------------------------
@tool
def lookup_city(name: str) -> str:
    """Facts about a city."""
    return f"{name}: 522000 inhabitants"


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
def test_tool_loop_then_parsed_final_answer(
    adapter: Adapter, fake: ProviderFake, target: Target, streaming: bool
) -> None:
    fake.push(
        Turn(tool_calls=[ToolCall("call_1", "lookup_city", {"name": "Lyon"})]),
        Turn(text=json.dumps({"city": "Lyon", "population": 522000})),
    )
    session = Session(adapter, tools=[lookup_city])
    if streaming:
        with session.stream("How many people live in Lyon?", output=CITY_SCHEMA) as events:
            kinds = [e.type for e in events]
        response = events.response
        assert "tool_result" in kinds and kinds[-1] == "message_done"
        assert events.partial_parsed == {"city": "Lyon", "population": 522000}
    else:
        response = session.send("How many people live in Lyon?", output=CITY_SCHEMA)
    assert response.parsed == {"city": "Lyon", "population": 522000}
    assert response.tool_calls == []
    assert fake.tool_result_ids_of(fake.last_request) == ["call_1"]
    assert "lookup_city" in fake.tool_names_of(fake.last_request)
    # history: question, tool call, result, final JSON (no trace of the output tool)
    assert [m.role for m in session.history] == ["user", "assistant", "user", "assistant"]
    assert session.history[-1].text == response.text
    assert all(OUTPUT_TOOL_NAME not in json.dumps(m.model_dump()) for m in session.history)
    _check_openai_bodies(fake, target)


# -- bad requests fail before anything is sent --------------------------------------------------------------
class _NotJSON:
    pass


class HasSocket(BaseModel):
    model_config = {"arbitrary_types_allowed": True}
    thing: _NotJSON


@pytest.mark.parametrize(
    ("output", "error", "words"),
    [
        (HasSocket, TypeError, "no JSON Schema.*_NotJSON, a Python class"),
        (_NotJSON, TypeError, "cannot be validated from JSON"),
        (Extraction(summary="x", sentiment=Sentiment.NEUTRAL, mentions=[]), TypeError,
         "not an instance"),
        ("Extraction", TypeError, "must be a type"),
        ({"type": "object", "properties": {"a": {"type": 7}}}, ValueError, "not a valid JSON Schema"),
        ({"type": "object", "default": {1, 2}}, TypeError, "JSON"),
    ],
    ids=["arbitrary-field", "arbitrary-class", "instance", "string", "bad-schema-dict",
         "set-in-dict"],
)
def test_bad_output_is_refused_before_any_request(
    adapter: Adapter, fake: ProviderFake, output: Any, error: type, words: str
) -> None:
    with pytest.raises(error, match=words):
        adapter.chat("Extract.", output=output)
    with pytest.raises(error):
        adapter.stream("Extract.", output=output)
    assert fake.chat_requests == []


def test_bad_options_are_refused_before_any_request(adapter: Adapter, fake: ProviderFake) -> None:
    with pytest.raises(ValueError, match="output_retries"):
        adapter.chat("x", output=Extraction, output_retries=-1)
    with pytest.raises(TypeError, match="needs output="):
        adapter.chat("x", output_retries=2)
    with pytest.raises(ValueError, match="mode must be one of"):
        StructuredOutput(Extraction, mode="grammar-please")
    assert fake.chat_requests == []


def test_session_refuses_a_bad_schema_without_a_trace(adapter: Adapter, fake: ProviderFake) -> None:
    session = Session(adapter)
    with pytest.raises(TypeError):
        session.send("Extract.", output=HasSocket)
    assert session.history == [] and fake.chat_requests == []
