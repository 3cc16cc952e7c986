"""Structured output, piece by piece: schemas and their provider dialects, validation, partial
parsing, ``Response.parsed`` serialization, the response cache, per-provider mechanism choices,
and the table rendering of parsed answers. (The cross-provider contract is
tests/contract/test_structured.py.)"""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from dispatch_nb import (
    APITimeoutError,
    OutputValidationError,
    Response,
    Session,
    StructuredOutput,
    TextBlock,
    ToolDefinition,
)
from dispatch_nb.cache import CachedAdapter, ResponseCache
from dispatch_nb.providers.anthropic import AnthropicAdapter, supports_output_config
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.providers.openai import OpenAIAdapter
from dispatch_nb.render import (
    compare_parsed_markdown,
    flatten_parsed,
    parsed_html,
    parsed_markdown,
    parsed_rows,
    response_markdown,
    rows_markdown,
)
from dispatch_nb.replay_only import ReplayOnlyAdapter
from dispatch_nb.wire.anthropic import anthropic_schema
from dispatch_nb.wire.openai_schema import openai_output_schema, openai_strict_schema
from dispatch_nb.wire.request import OUTPUT_TOOL_NAME
from dispatch_nb.wire.schema import is_recursive

from ..fakes.anthropic import AnthropicFake
from ..fakes.canonical import CanonicalFake
from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.provider import Stall, Turn
from ..fakes.structured import _anthropic_problem, _openai_strict_problem, mechanism_of


class Tag(BaseModel):
    label: str
    weight: int = 1


class Post(BaseModel):
    """A blog post."""

    title: str = Field(min_length=3, max_length=80)
    tags: list[Tag]
    score: float | None = None
    meta: dict[str, int] = {}


class Node(BaseModel):
    name: str
    children: list[Node] = []


# -- schemas --------------------------------------------------------------------------------------
def test_wire_schema_is_always_an_object() -> None:
    assert not StructuredOutput(Tag).wrapped
    listed = StructuredOutput(list[Tag])
    assert listed.wrapped and listed.schema["required"] == ["result"]
    assert listed.schema["properties"]["result"]["items"] == {"$ref": "#/$defs/Tag"}
    assert "Tag" in listed.schema["$defs"]  # definitions hoisted to the root the refs point at
    assert StructuredOutput(Literal["a", "b"]).schema["properties"]["result"]["enum"] == ["a", "b"]
    assert StructuredOutput(int).wrapped
    tree = StructuredOutput(Node)  # pydantic roots a recursive model at a $ref: inlined
    assert not tree.wrapped and tree.schema["type"] == "object" and is_recursive(tree.schema)


def test_names_and_descriptions() -> None:
    assert StructuredOutput(Post).name == "Post"
    assert StructuredOutput(Post).description == "A blog post."
    assert StructuredOutput(list[Tag]).name == "Tag_list"
    assert StructuredOutput({"title": "City info", "type": "object"}).name == "City_info"
    assert StructuredOutput(Tag, name="tag-v2", description="One tag.").description == "One tag."
    with pytest.raises(ValueError, match="1-64 letters"):
        StructuredOutput(Tag, name="a tag!")
    assert "title" not in json.dumps(StructuredOutput(list[Tag]).schema)  # pydantic's titles go
    assert "title" in StructuredOutput(Post).schema["properties"]  # (a field named title stays)


def test_openai_strict_schema() -> None:
    strict = openai_strict_schema(StructuredOutput(Tag).schema)
    assert strict is not None
    assert strict["required"] == ["label", "weight"] and strict["additionalProperties"] is False
    assert strict["properties"]["weight"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert _openai_strict_problem(strict, "x") is None
    assert _openai_strict_problem(StructuredOutput(Tag).schema, "x")  # the fake is not lenient

    # a map type cannot be strict: the whole schema goes with strict false
    assert openai_strict_schema(StructuredOutput(Post).schema) is None
    assert openai_output_schema(StructuredOutput(Post))[1] is False
    with pytest.raises(ValueError, match="cannot be made strict"):
        openai_output_schema(StructuredOutput(Post, strict=True))

    constrained = openai_strict_schema({
        "type": "object", "properties": {
            "code": {"type": "string", "minLength": 2, "description": "A code."},
            "pick": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
            "box": {"allOf": [{"$ref": "#/$defs/Box"}], "description": "the box"},
        }, "required": ["code", "pick", "box"],
        "$defs": {"Box": {"type": "object", "properties": {"w": {"type": "integer"}},
                          "required": ["w"]}},
    })
    assert constrained is not None
    assert constrained["properties"]["code"] == {"type": "string",
                                                 "description": "A code. {minLength: 2}"}
    assert "anyOf" in constrained["properties"]["pick"]
    assert constrained["properties"]["box"]["description"] == "the box"
    assert constrained["properties"]["box"]["additionalProperties"] is False
    assert _openai_strict_problem(constrained, "x") is None
    recursive = openai_strict_schema(StructuredOutput(Node).schema)
    assert recursive is not None and _openai_strict_problem(recursive, "x") is None


def test_anthropic_schema() -> None:
    cleaned = anthropic_schema(StructuredOutput(list[Tag]).schema)
    assert _anthropic_problem({"output_config": {"format": {"type": "json_schema",
                                                            "schema": cleaned}}}) is None
    bounded = StructuredOutput(Annotated[list[int], Field(min_length=2, max_length=5)])
    inner = anthropic_schema(bounded.schema)["properties"]["result"]
    assert "maxItems" not in inner and "minItems" not in inner
    assert inner["description"] == "{maxItems: 5, minItems: 2}"
    with pytest.raises(ValueError, match="recursive"):
        anthropic_schema(StructuredOutput(Node).schema)
    with pytest.raises(ValueError, match="map types"):
        anthropic_schema(StructuredOutput(Post).schema)
    assert is_recursive(StructuredOutput(Node).schema)
    assert not is_recursive(StructuredOutput(list[Tag]).schema)


def test_schema_dicts_are_checked() -> None:
    with pytest.raises(ValueError, match="empty dict"):
        StructuredOutput({})
    with pytest.raises(ValueError, match="at properties/a/type"):
        StructuredOutput({"type": "object", "properties": {"a": {"type": "thing"}}})


# -- validation and partial parsing ---------------------------------------------------------------
def test_parse_validates_and_explains() -> None:
    spec = StructuredOutput(list[Tag])
    assert spec.parse('{"result": [{"label": "x"}]}') == [Tag(label="x")]
    assert spec.parse('[{"label": "x", "weight": 2}]') == [Tag(label="x", weight=2)]  # bare value
    assert spec.parse('```json\n{"result": []}\n```') == []  # a fenced answer is fine
    with pytest.raises(OutputValidationError) as info:
        spec.parse('{"result": [{"weight": "heavy"}]}')
    assert info.value.code == "output_invalid"
    locs = [e["loc"] for e in info.value.errors]
    assert locs == [("result", 0, "label"), ("result", 0, "weight")]
    assert "result.0.label" in info.value.message


def test_null_from_a_strict_schema_means_the_default() -> None:
    spec = StructuredOutput(Tag)
    assert spec.parse('{"label": "x", "weight": null}') == Tag(label="x", weight=1)
    with pytest.raises(OutputValidationError) as info:
        spec.parse('{"label": null, "weight": 2}')  # required: null stays and fails
    assert info.value.code == "output_invalid"
    assert StructuredOutput(Post).parse(
        '{"title": "Hello", "tags": [{"label": "a", "weight": null}], "score": null}'
    ) == Post(title="Hello", tags=[Tag(label="a")])


def test_constraints_are_checked_even_where_providers_do_not() -> None:
    with pytest.raises(OutputValidationError, match="at least 3") as info:
        StructuredOutput(Post).parse('{"title": "Hi", "tags": []}')
    assert info.value.code == "output_invalid"


def test_partial() -> None:
    spec = StructuredOutput(list[Tag])
    assert spec.partial("") is None
    assert spec.partial('{"res') is None
    assert spec.partial('{"result": [{"label": "ab') == [{"label": "ab"}]
    assert spec.partial('```json\n{"result": [{"label": "x"}, {"la') == [{"label": "x"}, {}]
    assert StructuredOutput(Tag).partial('{"label": "x", "weight": 4') == {"label": "x", "weight": 4}


# -- Response.parsed ------------------------------------------------------------------------------
def test_parsed_survives_dumps_sensibly() -> None:
    plain = Response(content=[TextBlock(text="hi")])
    assert "parsed" not in plain.model_dump() and "parsed" not in plain.model_dump_json()
    tagged = Response(content=[TextBlock(text='{"result": [{"label": "x"}]}')],
                      parsed=[Tag(label="x")])
    assert tagged.model_dump()["parsed"] == [{"label": "x", "weight": 1}]
    again = Response.model_validate_json(tagged.model_dump_json())
    assert again.parsed == [{"label": "x", "weight": 1}]  # the JSON value
    assert again.text == tagged.text
    assert Response.model_validate(again.model_dump()) == again
    assert "parsed" not in tagged.model_dump(exclude={"parsed"})
    assert tagged.to_message().content == tagged.content


# -- mechanisms per provider ----------------------------------------------------------------------
def test_prompt_mode_puts_the_schema_in_the_system_prompt() -> None:
    with CanonicalFake() as fake:
        adapter = CanonicalAdapter("echo", base_url=fake.base_url)
        adapter.structured_output = "prompt"
        fake.push(Turn(text='Here you are: ```json\n{"result": [{"label": "text"}]}\n```'))
        response = adapter.chat("Tags?", system="Be brief.", output=list[Tag])
        body = fake.last_request.json
        assert "output" not in body and mechanism_of(body) is None
        assert body["system"].startswith("Be brief.\n\nAnswer with one JSON document")
        assert '"$defs"' in body["system"]
        assert response.parsed == [Tag(label="text", weight=1)]


def test_anthropic_mechanisms(caplog: pytest.LogCaptureFixture) -> None:
    assert supports_output_config("claude-sonnet-4-5") and supports_output_config("claude-opus-4-1")
    assert not supports_output_config("claude-sonnet-4-20250514")
    with AnthropicFake() as fake:
        new = AnthropicAdapter("claude-sonnet-4-5", base_url=fake.base_url, api_key="sk-ant-test")
        new.chat("x", output=Tag)
        assert mechanism_of(fake.last_request.json) == "output_config"
        # a recursive schema does not suit output_config: auto uses the tool, native refuses
        fake.push(Turn(text='{"name": "root", "children": []}'))
        assert new.chat("x", output=Node).parsed == Node(name="root")
        assert mechanism_of(fake.last_request.json) == "tool"
        count = len(fake.chat_requests)
        with pytest.raises(ValueError, match=r"recursive schemas.*structured_output='tool'"):
            new.chat("x", output=StructuredOutput(Node, mode="native"))
        assert len(fake.chat_requests) == count  # refused before any request

        # with thinking a forced tool is not allowed: auto + an instruction
        proxy = AnthropicAdapter("claude-sonnet-4-5", base_url=fake.base_url, api_key="sk-ant-test",
                                 structured_output="tool", max_tokens=4096)
        fake.push(Turn(text='{"label": "x"}'))
        with caplog.at_level(logging.INFO, logger="dispatch_nb"):
            answer = proxy.chat("x", output=Tag, system="Be brief.",
                                thinking={"type": "enabled", "budget_tokens": 1024})
        assert answer.parsed == Tag(label="x")
        body = fake.last_request.json
        assert body["tool_choice"] == {"type": "auto"}
        assert body["system"].startswith("Be brief.\n\nWhen you have the final answer")
        assert "output=tool" in caplog.records[-1].getMessage()


def test_tool_mode_refuses_a_tool_with_the_output_tools_name() -> None:
    with AnthropicFake() as fake:
        adapter = AnthropicAdapter("claude-3-5-haiku-latest", base_url=fake.base_url,
                                   api_key="sk-ant-test")
        clash = ToolDefinition(name=OUTPUT_TOOL_NAME, parameters={"type": "object"})
        with pytest.raises(ValueError, match="rename it"):
            adapter.chat("x", output=Tag, tools=[clash])


def test_output_and_response_format_together_are_refused() -> None:
    with OpenAIChatFake() as fake:
        adapter = OpenAIAdapter("m", backend="compatible", base_url=fake.base_url, max_retries=0)
        with pytest.raises(ValueError, match="not both"):
            adapter.chat("x", output=Tag, response_format={"type": "json_object"})
        with pytest.raises(ValueError, match="cannot use structured output mode"):
            OpenAIAdapter("gpt-5", api_key="k", base_url=fake.base_url,
                          structured_output="json_object").chat("x", output=Tag)
        assert fake.chat_requests == []


def test_compatible_server_fallback_is_remembered() -> None:
    with OpenAIChatFake.llama() as fake:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=fake.base_url,
                                max_retries=0)
        adapter.chat("x", output=Tag)
        assert [mechanism_of(r.json) for r in fake.chat_requests] == ["response_format",
                                                                     "json_object"]
        adapter.chat("x", output=Tag)
        assert mechanism_of(fake.chat_requests[-1].json) == "json_object"
        assert len(fake.chat_requests) == 3
        assert adapter.output_mode is not None


# -- the response cache ---------------------------------------------------------------------------
def test_cache_records_and_replays_structured_answers(tmp_path: Any) -> None:
    path = tmp_path / "c.jsonl"
    with CanonicalFake() as fake:
        fake.push(Turn(text='{"result": [{"label": "a", "weight": 3}]}'))
        live = CachedAdapter(CanonicalAdapter("echo", base_url=fake.base_url),
                             ResponseCache(path, mode="record"))
        recorded = live.chat("Tags?", output=list[Tag], stream=True)
        assert recorded.parsed == [Tag(label="a", weight=3)]
        plain_request = len(fake.chat_requests)
        live.chat("Tags?")  # the same prompt without output= is another request
        assert len(fake.chat_requests) == plain_request + 1
    replay = CachedAdapter(CanonicalAdapter("echo", base_url="http://127.0.0.1:9"),
                           ResponseCache(path, mode="replay"))
    with replay.stream("Tags?", output=list[Tag]) as stream:
        partials = [stream.partial_parsed for _ in stream]
    assert stream.response.parsed == recorded.parsed
    assert partials[-1] == [{"label": "a", "weight": 3}]
    line = json.loads(path.read_text().splitlines()[0])
    assert "parsed" not in line["response"]  # the raw answer is recorded, parsed on replay
    with pytest.raises(Exception, match="no recorded answer"):
        replay.chat("Tags?", output=Tag)  # another schema: another request
    # where the recording's provider cannot be built (binder: no extra), replay works the same
    stand_in = ReplayOnlyAdapter("fake", "echo", reason=ImportError("no fake here"),
                                 max_tokens=1024, provider_options=CanonicalAdapter.provider_options)
    offline = CachedAdapter(stand_in, ResponseCache(path, mode="replay"))
    assert offline.chat("Tags?", output=list[Tag]).parsed == recorded.parsed


def test_timeout_is_one_budget_for_every_attempt() -> None:
    with CanonicalFake() as fake:
        fake.push(Turn(text='{"result": "not a list"}'), Stall(3.0))
        adapter = CanonicalAdapter("echo", base_url=fake.base_url, max_retries=0)
        started = time.monotonic()
        with pytest.raises(APITimeoutError) as info:
            adapter.chat("Tags?", output=list[Tag], timeout=1.0)
        assert info.value.code == "timeout"
        assert time.monotonic() - started < 2.5
        assert len(fake.chat_requests) == 2  # the retry ran on what was left of the 1 s
        assert info.value.partial is not None
        assert info.value.partial.usage.output_tokens == 7  # the first attempt's tokens


async def test_async_session_with_output() -> None:
    with CanonicalFake() as fake:
        fake.push(Turn(text='{"label": "x"}'))
        session = Session(CanonicalAdapter("echo", base_url=fake.base_url))
        answer = await session.asend("Tag?", output=Tag)
        assert answer.parsed == Tag(label="x")
        assert session.usage.output_tokens == answer.usage.output_tokens


# -- rendering ------------------------------------------------------------------------------------
def test_rows_and_tables() -> None:
    assert parsed_rows([Tag(label="a"), Tag(label="b", weight=2)]) == [
        {"label": "a", "weight": 1}, {"label": "b", "weight": 2}]
    assert parsed_rows(Tag(label="a")) == [{"label": "a", "weight": 1}]
    assert parsed_rows("yes") == [{"value": "yes"}]
    assert parsed_rows(Post(title="Hello", tags=[Tag(label="x")]))[0]["tags"] == \
        '[{"label": "x", "weight": 1}]'
    table = rows_markdown(parsed_rows([{"a": "x|y", "b": None}, {"a": "line\nbreak", "c": 1}]))
    assert table.splitlines() == ["| # | a | b | c |", "|---|---|---|---|",
                                  "| 1 | x\\|y |  |  |", "| 2 | line<br>break |  | 1 |"]
    assert rows_markdown([]) == "*(empty list)*"


def test_parsed_answers_render_as_tables() -> None:
    response = Response(content=[TextBlock(text='{"result": [{"label": "<b>"}]}')],
                        parsed=[Tag(label="<b>")], model="m")
    md = response_markdown(response)
    assert md.startswith("| label | weight |") and "&lt;b&gt;" in md
    assert "<details><summary>JSON</summary>" in md and '"label": "<b>"' in md
    assert response._repr_markdown_() == md
    html = parsed_html(response)
    assert "<th>label</th>" in html and "<td>&lt;b&gt;</td>" in html and "<b>" not in html
    assert flatten_parsed([Tag(label="a")]) == {"1.label": "a", "1.weight": 1}
    other = response.model_copy(update={"parsed": [Tag(label="c", weight=2)]})
    both = compare_parsed_markdown([("model a", response), ("model b", other)])
    assert both.splitlines()[:4] == ["| field | model a | model b |", "|---|---|---|",
                                     "| 1.label | &lt;b&gt; | c |", "| 1.weight | 1 | 2 |"]


def test_html_repr_without_linkify_it() -> None:
    # gfm-like markdown-it turns on linkify, which raised ModuleNotFoundError at render time when
    # linkify-it-py is not installed: displaying any Response in a notebook failed
    pytest.importorskip("markdown_it")
    response = Response(content=[TextBlock(text='{"label": "a"}')], parsed=Tag(label="a"))
    html = response._repr_html_()
    assert html is not None and "<table>" in html and "<td>a</td>" in html
    plain = Response(content=[TextBlock(text="see https://example.org ~~old~~")])._repr_html_()
    assert plain is not None and "<s>old</s>" in plain


def test_a_table_of_amounts_is_not_latex_math() -> None:
    """``$5`` and ``$12`` in one table would be typeset as math by the front ends: the table
    escapes them and sits in a block MathJax skips; a table without ``$`` is left as it is."""
    prices = rows_markdown([{"item": "tea", "price": "$5"}, {"item": "cake", "price": "$12"}])
    assert "\\$5" in prices and "\\$12" in prices
    response = Response(content=[TextBlock(text='{"price": "$5"}')], model="m",
                        parsed={"price": "$5", "note": "and $12"})
    shown = parsed_markdown(response, footer=False)
    assert shown.startswith('<div class="tex2jax_ignore mathjax_ignore">') and "\\$5" in shown
    plain = parsed_markdown(Response(content=[TextBlock(text='{"a": 1}')], model="m",
                                     parsed={"a": 1}), footer=False)
    assert not plain.startswith("<div")


def test_a_json_schema_output_pickles_before_and_after_it_validated() -> None:
    """Batch rows travel pickled (a Dask cluster, a process pool): an ``output=`` dict schema's
    ``StructuredOutput`` must pickle, also once it has validated an answer."""
    import pickle

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    output = pickle.loads(pickle.dumps(StructuredOutput(schema)))
    assert output.parse('{"a": 1}') == {"a": 1}
    with pytest.raises(OutputValidationError) as info:
        output.parse('{"a": "x"}')
    assert info.value.code == "output_invalid"
    assert pickle.loads(pickle.dumps(output)).parse('{"a": 2}') == {"a": 2}
