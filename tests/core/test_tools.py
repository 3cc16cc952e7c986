"""@tool / Tool: JSON Schemas from type hints and docstrings, validation, results, errors."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from dispatch_nb import TextBlock, ToolDefinition, ToolResultBlock, ToolUseBlock
from dispatch_nb.adapter import normalize_tools
from dispatch_nb.session import Tool, tool
from dispatch_nb.tools import parse_docstring


def call(name: str, **arguments: Any) -> ToolUseBlock:
    return ToolUseBlock(id="call_1", name=name, arguments=arguments)


class Point(BaseModel):
    x: float
    y: float


@tool
def forecast(
    city: str,
    days: Annotated[int, Field(ge=1, le=14)] = 3,
    unit: Literal["C", "F"] = "C",
    near: Point | None = None,
) -> dict[str, Any]:
    """Weather forecast for a city.

    Uses the national weather service;
    results are cached for an hour.

    Args:
        city: The city name,
            e.g. "Paris".
        days (int): How many days ahead.
        unit: Temperature unit.

    Returns:
        The forecast.
    """
    return {"city": city, "days": days, "unit": unit, "near": near}


# -- schema --------------------------------------------------------------------------------------
def test_schema_from_type_hints() -> None:
    schema = forecast.parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["city"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["city"] == {"type": "string", "description": 'The city name, e.g. "Paris".'}
    assert props["days"]["type"] == "integer"
    assert (props["days"]["minimum"], props["days"]["maximum"], props["days"]["default"]) == (
        1, 14, 3)
    assert props["unit"]["enum"] == ["C", "F"]
    assert "title" not in schema and all("title" not in p for p in props.values())
    assert schema["$defs"]["Point"]["properties"]["x"] == {"type": "number"}


def test_description_is_the_first_paragraph() -> None:
    assert forecast.description == "Weather forecast for a city."
    assert forecast.name == "forecast"
    assert forecast.definition == ToolDefinition(
        name="forecast", description=forecast.description, parameters=forecast.parameters
    )


def test_name_and_description_overrides() -> None:
    @tool(name="lookup_user", description="Find a user by e-mail.")
    def find(email: str) -> str:
        """Ignored."""
        return email

    @tool()
    def plain(n: int) -> int:
        return n

    assert (find.name, find.description) == ("lookup_user", "Find a user by e-mail.")
    assert (plain.name, plain.description) == ("plain", "")
    assert tool(find) is find


def test_decorated_function_is_still_a_function() -> None:
    assert forecast("Oslo", days=2)["days"] == 2
    assert forecast.__name__ == "forecast"
    assert forecast.__doc__ is not None and "Weather forecast" in forecast.__doc__


def test_numpy_and_sphinx_docstrings() -> None:
    def numpy_style(a: int, b: int = 2) -> int:
        """Add two numbers
        that matter.

        Parameters
        ----------
        a : int
            The first.
        b : int, optional
            The second,
            defaulting to 2.

        Returns
        -------
        int
        """
        return a + b

    def sphinx_style(a: int) -> int:
        """Negate.

        :param int a: The number
            to negate.
        :returns: the negation
        """
        return -a

    numpy_tool, sphinx_tool = tool(numpy_style), tool(sphinx_style)
    assert numpy_tool.description == "Add two numbers that matter."
    assert numpy_tool.parameters["properties"]["b"]["description"] == "The second, defaulting to 2."
    assert numpy_tool.parameters["properties"]["a"]["description"] == "The first."
    assert sphinx_tool.description == "Negate."
    assert sphinx_tool.parameters["properties"]["a"]["description"] == "The number to negate."


def test_parse_docstring_edge_cases() -> None:
    assert parse_docstring("") == ("", {})
    assert parse_docstring("Just one line.") == ("Just one line.", {})
    summary, params = parse_docstring("Summary.\nArgs:\n    *items: Things.\n    **kw: More.\n")
    assert summary == "Summary."
    assert params == {"items": "Things.", "kw": "More."}


def test_unusable_functions_are_refused_clearly() -> None:
    def star(*values: int) -> int:
        return sum(values)

    with pytest.raises(TypeError, match=r"\*values"):
        tool(star)
    with pytest.raises(ValueError, match="name"):
        tool(lambda x: x)
    with pytest.raises(TypeError, match="function"):
        Tool(42)  # type: ignore[arg-type]


def test_untyped_and_positional_only_parameters() -> None:
    def legacy(a, /, b=1):  # type: ignore[no-untyped-def]
        return [a, b]

    legacy_tool = tool(legacy)
    assert legacy_tool.parameters["required"] == ["a"]
    assert legacy_tool.run(call("legacy", a="x", b=2)).content == '["x",2]'


def test_normalize_tools_wraps_plain_functions() -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    (definition,) = normalize_tools([add])
    assert isinstance(definition, ToolDefinition)
    assert definition.name == "add" and definition.parameters["required"] == ["a", "b"]
    assert normalize_tools([forecast]) == [forecast.definition]


# -- running -------------------------------------------------------------------------------------
def test_valid_arguments_are_coerced_before_the_handler_runs() -> None:
    result = forecast.run(call("forecast", city="Paris", days="5", near={"x": 1, "y": 2}))
    assert result == ToolResultBlock(
        tool_use_id="call_1",
        content='{"city":"Paris","days":5,"unit":"C","near":{"x":1.0,"y":2.0}}',
    )


def test_invalid_arguments_never_reach_the_handler() -> None:
    ran: list[int] = []

    @tool
    def count(n: int) -> int:
        ran.append(n)
        return n

    result = count.run(call("count", n="many", extra=1))
    assert result.is_error and not ran
    assert result.text == (
        "invalid arguments for count: n: Input should be a valid integer, unable to parse "
        "string as an integer (got 'many'); extra: Extra inputs are not permitted"
    )
    assert "Field required" in count.run(call("count")).text
    assert "less than or equal to 14" in forecast.run(call("forecast", city="A", days=40)).text


def test_arguments_that_were_not_json_become_an_error_result() -> None:
    ran: list[str] = []

    @tool
    def echo(text: str) -> str:
        ran.append(text)
        return text

    bad = ToolUseBlock(id="c9", name="echo", raw_arguments='{"text": "unterminated',
                       arguments_error="the model's tool arguments are not valid JSON")
    result = echo.run(bad)
    assert result.is_error and result.tool_use_id == "c9" and not ran
    assert "not valid JSON" in result.text and "JSON object" in result.text


def test_handler_exception_is_a_short_error_result(caplog: pytest.LogCaptureFixture) -> None:
    @tool
    def divide(a: float, b: float) -> float:
        return a / b

    result = divide.run(call("divide", a=1, b=0))
    assert result.is_error
    assert result.text == "divide failed: ZeroDivisionError: float division by zero"
    assert "Traceback" not in result.text
    assert any("divide" in r.getMessage() for r in caplog.records if r.name == "dispatch_nb")

    @tool
    def noisy() -> None:
        raise RuntimeError("x" * 5000)

    assert len(noisy.run(call("noisy")).text) <= 1000


@dataclasses.dataclass
class Reading:
    value: float
    unit: str


@pytest.mark.parametrize(
    ("value", "content"),
    [
        ("plain text", "plain text"),
        ({"a": [1, 2]}, '{"a":[1,2]}'),
        ([1, "two", None], '[1,"two",null]'),
        (Point(x=1, y=2), '{"x":1.0,"y":2.0}'),
        (Reading(21.5, "C"), '{"value":21.5,"unit":"C"}'),
        (None, ""),
        (3.5, "3.5"),
        ([TextBlock("a"), TextBlock("b")], [TextBlock("a"), TextBlock("b")]),
    ],
)
def test_results_are_serialized(value: Any, content: Any) -> None:
    @tool
    def give() -> Any:
        return value

    result = give.run(call("give"))
    assert not result.is_error
    assert result.content == content


def test_a_returned_tool_result_block_is_kept_with_the_right_id() -> None:
    @tool
    def custom() -> ToolResultBlock:
        return ToolResultBlock(tool_use_id="ignored", content="bad input", is_error=True)

    assert custom.run(call("custom")) == ToolResultBlock(
        tool_use_id="call_1", content="bad input", is_error=True
    )


def test_async_handlers_run_sync_and_async() -> None:
    @tool
    async def slow_add(a: int, b: int) -> int:
        await asyncio.sleep(0.01)
        if a < 0:
            raise ValueError("a must be positive")
        return a + b

    assert slow_add.is_async
    assert slow_add.run(call("slow_add", a=2, b=3)).content == "5"
    result = asyncio.run(slow_add.arun(call("slow_add", a=-1, b=3)))
    assert result.is_error and result.text == "slow_add failed: ValueError: a must be positive"

    async def inside_a_running_loop() -> ToolResultBlock:
        # a notebook: the sync API is used while an event loop runs in this thread
        return slow_add.run(call("slow_add", a=1, b=1))

    assert asyncio.run(inside_a_running_loop()).content == "2"


def test_arun_runs_sync_handlers_in_a_worker_thread() -> None:
    seen: list[str] = []

    @tool
    def where() -> str:
        seen.append(threading.current_thread().name)
        return "ok"

    assert asyncio.run(where.arun(call("where"))).content == "ok"
    assert seen and seen[0] != threading.main_thread().name
