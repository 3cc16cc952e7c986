"""Python functions as tools a model can call: ``@tool`` and :class:`Tool` (docs/sessions.md,
"Tools"): a JSON Schema from the type hints, a description from the docstring, arguments
validated before the function runs, and every problem an ``is_error`` result, never a crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, overload

import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema

from .types import TextBlock, ToolDefinition, ToolResultBlock, ToolUseBlock

__all__ = ["Tool", "parse_docstring", "tool"]

logger = logging.getLogger("dispatch_nb")

#: longest error message a failed tool sends back to the model
MAX_ERROR_CHARS = 1000


class Tool:
    """A Python function the model can call, with a JSON Schema built from its signature; usually
    made with :func:`tool`. Calling it calls the function unchanged."""

    function: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]
    definition: ToolDefinition
    is_async: bool

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        if not callable(function):
            raise TypeError(f"a tool needs a function, not {type(function).__name__}")
        self.function = function
        self.name: str = name or str(getattr(function, "__name__", ""))
        if not self.name or self.name == "<lambda>":
            raise ValueError("this function has no usable name: pass @tool(name=...)")
        summary, param_docs = parse_docstring(inspect.getdoc(function) or "")
        self.description = description if description is not None else summary
        signature = inspect.signature(function)
        self._model = _arguments_model(function, signature, param_docs, self.name)
        self._positional = [p.name for p in signature.parameters.values()
                            if p.kind is inspect.Parameter.POSITIONAL_ONLY]
        self.parameters = self._model.model_json_schema(schema_generator=_NoTitles)
        self.parameters.pop("title", None)
        self.parameters.setdefault("properties", {})
        self.definition = ToolDefinition(
            name=self.name, description=self.description, parameters=self.parameters
        )
        target = function
        while isinstance(target, functools.partial):
            target = target.func
        self.is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
            getattr(target, "__call__", None)  # noqa: B004 - async callable objects
        )
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function itself (no validation)."""
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, description={self.description!r})"

    # -- validation and calling ----------------------------------------------------------------
    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The validated keyword arguments for ``arguments`` (raises ``pydantic.ValidationError``)."""
        validated = self._model.model_validate(dict(arguments))
        return {name: getattr(validated, name) for name in type(validated).model_fields}

    def _invoke(self, kwargs: dict[str, Any]) -> Any:
        args = [kwargs.pop(name) for name in self._positional if name in kwargs]
        return self.function(*args, **kwargs)

    def run(self, call: ToolUseBlock) -> ToolResultBlock:
        """Execute a model's tool call; problems become an ``is_error`` result, never an exception.

        An async function is run to completion (on a worker thread if this thread already runs an
        event loop, as in a notebook). ``KeyboardInterrupt`` and other ``BaseException`` s pass.
        """
        prepared = self._prepare(call)
        if isinstance(prepared, ToolResultBlock):
            return prepared
        try:
            value = self._invoke(prepared)
            if inspect.isawaitable(value):
                value = _run_coroutine(value)
        except Exception as exc:
            return self._failure(call, exc)
        return tool_result(call.id, value)

    async def arun(self, call: ToolUseBlock) -> ToolResultBlock:
        """The async twin of :meth:`run`: async functions are awaited, sync ones run in a thread."""
        prepared = self._prepare(call)
        if isinstance(prepared, ToolResultBlock):
            return prepared
        try:
            if self.is_async:
                value = await self._invoke(prepared)
            else:
                value = await asyncio.to_thread(self._invoke, prepared)
                if inspect.isawaitable(value):
                    value = await value
        except Exception as exc:
            return self._failure(call, exc)
        return tool_result(call.id, value)

    def _prepare(self, call: ToolUseBlock) -> dict[str, Any] | ToolResultBlock:
        if call.arguments_error:
            return error_result(
                call.id,
                f"{call.arguments_error}. Call {self.name} again with a JSON object of arguments.",
            )
        try:
            return self.validate(call.arguments)
        except pydantic.ValidationError as exc:
            return error_result(
                call.id, f"invalid arguments for {self.name}: {_describe_validation(exc)}"
            )

    def _failure(self, call: ToolUseBlock, exc: Exception) -> ToolResultBlock:
        logger.warning("tool %s raised %s: %s", self.name, type(exc).__name__, exc)
        logger.debug("tool %s traceback", self.name, exc_info=exc)
        text = str(exc)
        message = f"{self.name} failed: {type(exc).__name__}" + (f": {text}" if text else "")
        return error_result(call.id, message)


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function into a :class:`Tool`: ``@tool``, ``@tool()`` or
    ``@tool(name="...", description="...")``. A :class:`Tool` passes through unchanged."""
    if function is not None:
        if isinstance(function, Tool) and name is None and description is None:
            return function
        return Tool(function, name=name, description=description)
    return functools.partial(Tool, name=name, description=description)


# -- results ---------------------------------------------------------------------------------------
def tool_result(tool_use_id: str, value: Any) -> ToolResultBlock:
    """The result block for what a tool returned: strings as they are, ``TextBlock`` s as blocks,
    anything else (dicts, lists, numbers, pydantic models, dataclasses) as JSON."""
    if isinstance(value, ToolResultBlock):
        return value.model_copy(update={"tool_use_id": tool_use_id})
    if value is None or isinstance(value, str):
        return ToolResultBlock(tool_use_id=tool_use_id, content=value or "")
    if isinstance(value, TextBlock):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(v, TextBlock) for v in value):
        return ToolResultBlock(tool_use_id=tool_use_id, content=list(value))
    try:
        text = pydantic_core.to_json(value, fallback=str).decode()
    except Exception:  # something even the fallback cannot render
        text = str(value)
    return ToolResultBlock(tool_use_id=tool_use_id, content=text)


def error_result(tool_use_id: str, message: str) -> ToolResultBlock:
    """An ``is_error`` result with a message cut to a readable length."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 1] + "…"
    return ToolResultBlock(tool_use_id=tool_use_id, content=message, is_error=True)


def _describe_validation(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        message = error["msg"]
        if error["type"] not in ("missing", "extra_forbidden") and "input" in error:
            shown = repr(error["input"])
            message += f" (got {shown[:60]}{'…' if len(shown) > 60 else ''})"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _run_coroutine(awaitable: Any) -> Any:
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    # An event loop already runs in this thread (a notebook): run ours on a worker thread.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dispatch_nb-tool") as pool:
        return pool.submit(asyncio.run, wait()).result()


# -- the JSON Schema -------------------------------------------------------------------------------
class _NoTitles(GenerateJsonSchema):
    """Leave out the ``title`` pydantic derives from every parameter name (noise for a model)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _arguments_model(
    function: Callable[..., Any],
    signature: inspect.Signature,
    param_docs: Mapping[str, str],
    name: str,
) -> type[BaseModel]:
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        hints = {}
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(
                f"tool {name}: *{param.name} / **{param.name} cannot be described to a model; "
                "give the function named, typed parameters"
            )
        annotation = hints.get(param.name, param.annotation)
        if annotation is inspect.Parameter.empty:
            annotation = Any
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, Field(default, description=param_docs.get(param.name) or None))
    try:
        return pydantic.create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    except (pydantic.PydanticSchemaGenerationError, TypeError, NameError) as exc:
        raise TypeError(f"tool {name}: cannot build a JSON Schema from its type hints: {exc}") from exc


# -- docstrings ------------------------------------------------------------------------------------
_GOOGLE_HEADER = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters)\s*:\s*$"
)
_ANY_GOOGLE_HEADER = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_GOOGLE_ITEM = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_PARAM_HEADERS = {"parameters", "other parameters", "keyword arguments", "params"}
_NUMPY_ITEM = re.compile(r"^\*{0,2}(\w+)\s*(?::.*)?$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_SPHINX_FIELD = re.compile(r"^:\w+")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _rule_follows(lines: list[str], i: int) -> bool:
    """Whether the line after ``lines[i]`` is a NumPy section rule (``-----``)."""
    rule = lines[i + 1].strip() if i + 1 < len(lines) else ""
    return len(rule) >= 3 and set(rule) == {"-"}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(summary, {parameter: description})`` from a Google, NumPy or Sphinx style docstring.

    The summary is the first paragraph, its lines joined with spaces.
    """
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary_lines: list[str] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if (not stripped or _ANY_GOOGLE_HEADER.match(stripped) or _SPHINX_FIELD.match(stripped)
                or _rule_follows(lines, i)):
            break
        summary_lines.append(stripped)
    params: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if _GOOGLE_HEADER.match(stripped):
            i = _google_section(lines, i + 1, _indent(line), params)
        elif stripped.lower() in _NUMPY_PARAM_HEADERS and _rule_follows(lines, i):
            i = _numpy_section(lines, i + 2, _indent(line), params)
        elif match := _SPHINX_PARAM.match(stripped):
            text = [match.group(2).strip()]
            i += 1
            while i < len(lines) and lines[i].strip() and not _SPHINX_FIELD.match(lines[i].strip()):
                text.append(lines[i].strip())
                i += 1
            params[match.group(1)] = " ".join(t for t in text if t)
        else:
            i += 1
    return " ".join(summary_lines), params


def _google_section(lines: list[str], i: int, header_indent: int, out: dict[str, str]) -> int:
    item_indent: int | None = None
    current: str | None = None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        indent = _indent(line)
        if indent <= header_indent:
            break
        if item_indent is None:
            item_indent = indent
        match = _GOOGLE_ITEM.match(line.strip()) if indent == item_indent else None
        if match:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif current is not None and indent > item_indent:
            out[current] = f"{out[current]} {line.strip()}".strip()
        i += 1
    return i


def _numpy_section(lines: list[str], i: int, header_indent: int, out: dict[str, str]) -> int:
    current: str | None = None
    while i < len(lines):
        line = lines[i]
        if _rule_follows(lines, i) and line.strip():
            break  # the next section
        if not line.strip():
            i += 1
            continue
        indent = _indent(line)
        if indent <= header_indent:
            match = _NUMPY_ITEM.match(line.strip())
            if not match:
                break
            current = match.group(1)
            out[current] = ""
        elif current is not None:
            out[current] = f"{out[current]} {line.strip()}".strip()
        i += 1
    return i
