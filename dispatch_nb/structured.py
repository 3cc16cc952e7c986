"""Structured output: answers as validated Python objects, the same way on every provider.

:class:`StructuredOutput` is what ``output=`` asks for (its wire schema, validation, partial
parsing); :func:`open_structured` runs a call's attempts until the answer validates, as a
:class:`StructuredResponseStream`. What each provider sends, retries and errors:
docs/structured-output.md.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from .call_control import TurnControl
from .cost import Cost, add_costs
from .errors import APITimeoutError, DispatchError, OutputValidationError
from .stream import Accumulator, AsyncResponseStream, ResponseStream
from .types import (
    Message,
    Response,
    StreamDelta,
    TextBlock,
    ToolDefinition,
    ToolUseBlock,
    Usage,
    text_delta,
)
from .wire.request import OUTPUT_MODES, OUTPUT_TOOL_NAME, ChatRequest
from .wire.schema import is_object_root, map_schema, nullable, resolver

if TYPE_CHECKING:
    from .cancel import CancelToken

__all__ = [
    "DEFAULT_OUTPUT_RETRIES",
    "OUTPUT_MODES",
    "OUTPUT_TOOL_NAME",
    "RESULT_KEY",
    "AsyncStructuredResponseStream",
    "StructuredOutput",
    "StructuredResponseStream",
    "as_output",
    "open_structured",
    "prompted",
    "settle_answer",
]

log = logging.getLogger("dispatch_nb")

#: the property that wraps a schema whose root is not an object (``{"result": [...]}``)
RESULT_KEY = "result"
#: how many times an invalid answer is sent back for another try, unless ``output_retries=``
DEFAULT_OUTPUT_RETRIES = 1

_NAME_OK = re.compile(r"[^a-zA-Z0-9_-]+")

# -- what output= asks for ---------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    name = getattr(tp, "__name__", None)
    if not isinstance(name, str):
        return re.sub(r"\W+", "_", str(tp)).strip("_") or "output"
    args = getattr(tp, "__args__", None)
    return "_".join([*map(_type_name, args), name]) if args else name


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _json_text(text: str) -> str:
    """The JSON inside an answer: the text itself, or the inside of its Markdown code fence
    (also after a line of prose, as models write when only asked in the prompt)."""
    stripped = text.strip()
    if not stripped.startswith("```"):
        if stripped[:1] in ("{", "[", '"') or "```" not in stripped:
            return stripped
        stripped = stripped[stripped.index("```"):]
    body = stripped[3:]
    newline = body.find("\n")
    body = body[newline + 1:] if newline >= 0 else ""
    end = body.find("```")
    return (body[:end] if end >= 0 else body).strip()


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class StructuredOutput:
    """What ``output=`` asks for, with its JSON Schema, validation and partial parsing.

    ``target``: a type pydantic validates or a JSON Schema ``dict``; ``name`` (1-64 of
    ``[a-zA-Z0-9_-]``), ``description``, ``mode`` and ``strict``: docs/structured-output.md. Raises
    ``TypeError`` / ``ValueError`` for what cannot be asked for — before any request.
    """

    def __init__(
        self,
        target: Any,
        *,
        name: str | None = None,
        description: str | None = None,
        mode: str = "auto",
        strict: bool | None = None,
    ) -> None:
        if mode not in OUTPUT_MODES:
            raise ValueError(f"mode must be one of {', '.join(OUTPUT_MODES)}, not {mode!r}")
        if isinstance(target, StructuredOutput):
            raise TypeError("target is already a StructuredOutput")
        #: what was asked for: a type, or the JSON Schema dict
        self.target = target
        self.mode = mode
        self.strict = strict
        self._type_adapter: Any = None
        self._validator: Any = None
        if isinstance(target, Mapping):
            self.schema_of_value = self._check_schema_dict(target)
            default_name = self.schema_of_value.get("title")
        else:
            self.schema_of_value = self._schema_of_type(target)
            default_name = _type_name(target)
        #: the schema sent to providers (always an object at the root); ``wrapped``: True when
        #: it wraps the value as ``{"result": ...}``
        self.schema, self.wrapped = _wire_schema(self.schema_of_value)
        raw_name = name if name is not None else (default_name or "output")
        cleaned = _NAME_OK.sub("_", str(raw_name)).strip("_")[:64]
        if name is not None and cleaned != name:
            raise ValueError(f"name must be 1-64 letters, digits, '_' or '-', not {name!r}")
        #: the schema's name (OpenAI's ``json_schema.name``)
        self.name = cleaned or "output"
        described = self.schema_of_value.get("description")
        #: what the answer is, for the model (OpenAI's ``description``, the tool's description)
        self.description: str | None = description if description is not None else (
            described if isinstance(described, str) and described.strip() else None
        )
        try:
            self._schema_json = orjson.dumps(self.schema, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError as exc:
            raise TypeError(f"the output schema is not JSON: {exc}") from None

    # -- building ------------------------------------------------------------------------------
    def _check_schema_dict(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        try:
            data = orjson.loads(orjson.dumps(schema))
        except TypeError as exc:
            raise TypeError(
                f"output= is a dict but not a JSON Schema made of JSON values: {exc}"
            ) from None
        if not isinstance(data, dict) or not data:
            raise ValueError("output= is an empty dict: give a JSON Schema such as "
                             '{"type": "object", "properties": {...}}')
        from jsonschema import exceptions, validators

        cls = validators.validator_for(data)
        try:
            cls.check_schema(data)
        except exceptions.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            raise ValueError(f"output= is not a valid JSON Schema: at {where}: {exc.message}") from None
        self._validator = cls  # its class (an instance does not pickle: batch rows are pickled)
        return data

    def _schema_of_type(self, target: Any) -> dict[str, Any]:
        if target is None or isinstance(target, (str, bytes, int, float, bool)):
            raise TypeError(
                f"output= must be a type (a pydantic model, TypedDict, dataclass, list[...], "
                f"Literal[...]) or a JSON Schema dict, not {target!r}"
            )
        from pydantic import BaseModel, TypeAdapter
        from pydantic.errors import PydanticInvalidForJsonSchema, PydanticUserError

        if isinstance(target, BaseModel):
            raise TypeError(f"output= takes the class {type(target).__name__}, not an instance of it")
        try:
            adapter = TypeAdapter(target)
            schema = adapter.json_schema(mode="validation")
        except PydanticInvalidForJsonSchema as exc:
            found = re.search(r"<class '([^']+)'>", str(exc))
            why = (f"it holds a {found.group(1).rsplit('.', 1)[-1]}, a Python class no JSON can "
                   "describe" if found else _first_line(exc))
            raise TypeError(
                f"output={_type_name(target)} has no JSON Schema, so no model can be asked for it "
                f"({why}); use fields of JSON types (str, int, float, bool, lists, nested "
                "models, enums, Literal, datetime...)"
            ) from None
        except (PydanticUserError, TypeError, NameError) as exc:
            raise TypeError(
                f"output={_type_name(target)} cannot be validated from JSON ({_first_line(exc)}); "
                "use a pydantic model, a TypedDict, a dataclass, list[...] of those, Literal[...], "
                "a basic type or a JSON Schema dict"
            ) from None
        self._type_adapter = adapter
        return dict(map_schema(schema, lambda n: {k: v for k, v in n.items() if k != "title"}))

    # -- what wire formats read (wire.request.OutputSpec) ----------------------------------------
    def tool_definition(self) -> ToolDefinition:
        """The tool whose arguments are the answer (``tool`` mode)."""
        what = self.description or f"the {self.name} answer"
        return ToolDefinition(
            name=OUTPUT_TOOL_NAME,
            description=f"Give your final answer by calling this tool: its arguments are the "
                        f"answer ({what}).",
            parameters=self.schema,
        )

    def instructions(self) -> str:
        """What ``prompt`` mode adds to the system prompt."""
        return ("Answer with one JSON document and nothing else (no prose, no code fences). "
                f"It must be valid for this JSON Schema:\n{self._schema_json}")

    def tool_instructions(self) -> str:
        """What ``tool`` mode adds to the system prompt when the tool cannot be forced."""
        return (f"When you have the final answer, give it by calling the {OUTPUT_TOOL_NAME} tool "
                "(its arguments are the answer), not as text.")

    def key_material(self) -> dict[str, Any]:
        """What makes two requests for structured output different (the response cache's key)."""
        return {"name": self.name, "description": self.description, "schema": self.schema,
                "mode": self.mode, "strict": self.strict}

    def __repr__(self) -> str:
        return f"StructuredOutput({_type_name(self.target)}, name={self.name!r}, mode={self.mode!r})"

    # -- parsing -------------------------------------------------------------------------------
    def partial(self, text: str) -> Any:
        """The value so far from the incomplete JSON ``text`` (dicts, lists, strings cut short),
        unwrapped; None while nothing parses."""
        body = _json_text(text)
        if not body:
            return None
        from pydantic_core import from_json

        try:
            value = from_json(body, allow_partial="trailing-strings")
        except ValueError:
            return None
        if self.wrapped:
            return value.get(RESULT_KEY) if isinstance(value, dict) else value
        return value

    def parse(self, answer: str | Response) -> Any:
        """Validate an answer (its text, or a :class:`Response`): the parsed value, or an
        :class:`~dispatch_nb.errors.OutputValidationError` saying what is wrong."""
        text = answer.text if isinstance(answer, Response) else answer
        body = _json_text(text)
        if not body:
            raise self._invalid(text, [{"type": "json_invalid", "loc": (),
                                        "msg": "the answer is empty", "input": text}])
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise self._invalid(text, [{"type": "json_invalid", "loc": (), "msg": f"Invalid JSON: {exc}",
                                        "input": _short(body, 200)}]) from None
        prefix: tuple[Any, ...] = ()
        if self.wrapped and isinstance(value, dict) and RESULT_KEY in value:
            value, prefix = value[RESULT_KEY], (RESULT_KEY,)
        # (a wrapped answer without the wrapper is read as the bare value)
        value = _drop_added_nulls(value, self.schema_of_value)
        if self._type_adapter is None:  # a JSON Schema dict
            errors = self._validator(self.schema_of_value).iter_errors(value)
            found = sorted(errors, key=lambda e: list(e.absolute_path))
            if found:
                raise self._invalid(text, [{"type": e.validator, "loc": (*prefix, *e.absolute_path),
                                            "msg": e.message, "input": e.instance} for e in found])
            return value
        from pydantic import ValidationError

        try:
            return self._type_adapter.validate_json(orjson.dumps(value))
        except ValidationError as exc:
            raise self._invalid(text, [
                {"type": e["type"], "loc": (*prefix, *e["loc"]), "msg": e["msg"],
                 "input": e.get("input")}
                for e in exc.errors(include_url=False, include_context=False)
            ]) from None

    def _invalid(self, text: str, errors: list[dict[str, Any]]) -> OutputValidationError:
        """The error of an answer ``text`` with these (one or more) validation ``errors``."""
        loc = ".".join(str(p) for p in errors[0]["loc"]) or "(the whole answer)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return OutputValidationError(
            f"the answer does not match the {self.name} schema: at {loc}: {errors[0]['msg']}{more}",
            text=text, errors=errors,
        )

    def retry_prompt(self, errors: list[dict[str, Any]], *, tool: bool) -> str:
        """The message that sends validation ``errors`` back to the model."""
        lines = ["Your answer does not match the required JSON schema:"]
        for error in errors[:20]:
            loc = ".".join(str(p) for p in error["loc"]) or "the whole answer"
            line = f"- at {loc}: {error['msg']}"
            if error.get("type") not in ("missing", "json_invalid") and "input" in error:
                line += f" (you gave {_short(error['input'])})"
            lines.append(line)
        if len(errors) > 20:
            lines.append(f"- ... and {len(errors) - 20} more")
        lines.append(f"Call the {OUTPUT_TOOL_NAME} tool again with corrected arguments."
                     if tool else "Answer again with only the corrected JSON.")
        return "\n".join(lines)


def _wire_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The wire schema for the value schema ``schema`` (an object at the root) and whether it
    wraps the value as ``{"result": ...}``."""
    value = {k: v for k, v in schema.items() if k not in ("$schema", "$id")}
    ref = value.get("$ref")
    if isinstance(ref, str) and set(value) <= {"$ref", "$defs", "definitions", "description"}:
        target = resolver(value)(ref)
        if isinstance(target, dict) and is_object_root(target):
            # a recursive model: its definition at the root, the $defs kept for the recursion
            kept = {k: value[k] for k in ("$defs", "definitions") if k in value}
            return {**copy.deepcopy(target), **kept}, False
    if is_object_root(value):
        return value, False
    defs: dict[str, Any] = {key: value.pop(key) for key in ("$defs", "definitions") if key in value}
    inner = map_schema(
        value,
        lambda n: {**n, "$ref": f"#/properties/{RESULT_KEY}"} if n.get("$ref") == "#" else n,
    )
    wire: dict[str, Any] = {"type": "object", "properties": {RESULT_KEY: inner},
                            "required": [RESULT_KEY], "additionalProperties": False, **defs}
    return wire, True


def _drop_added_nulls(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` without the ``null`` s a strict schema allowed where the schema itself does not
    (optional properties made nullable): their defaults apply instead."""
    resolve = resolver(schema)

    def walk(item: Any, node: Any, depth: int) -> Any:
        if depth > 64 or not isinstance(node, dict):
            return item
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = resolve(ref)
            if isinstance(target, dict):
                node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        if isinstance(item, dict):
            properties = node.get("properties")
            if not isinstance(properties, dict):
                return item
            required = set(node.get("required") or [])
            out = {}
            for key, sub in item.items():
                schema_of = properties.get(key)
                if (sub is None and schema_of is not None and key not in required
                        and not nullable(schema_of, resolve)):
                    continue
                out[key] = walk(sub, schema_of, depth + 1) if schema_of is not None else sub
            return out
        if isinstance(item, list) and isinstance(node.get("items"), dict):
            return [walk(sub, node["items"], depth + 1) for sub in item]
        options = [s for s in node.get("anyOf") or node.get("oneOf") or []
                   if isinstance(s, dict) and s.get("type") != "null"]
        if len(options) == 1:
            return walk(item, options[0], depth + 1)
        return item

    return walk(value, schema, 0)


# -- what structured output needs of an adapter -------------------------------------------------------
# Typed structurally: the adapter imports this module to run ``output=`` calls, so this module
# must not import the adapter back; every :class:`~dispatch_nb.adapter.Adapter` fits.
class OutputModel(Protocol):
    """What structured output uses of an adapter (any :class:`~dispatch_nb.adapter.Adapter`)."""

    @property
    def provider_name(self) -> str: ...

    @property
    def model_name(self) -> str: ...

    @property
    def default_timeout(self) -> float | None: ...

    def output_mode(self, request: ChatRequest) -> str | None: ...

    def open_stream(self, request: ChatRequest, timeout: float | None,
                    cancel: CancelToken | None) -> ResponseStream: ...

    def aopen_stream(self, request: ChatRequest, timeout: float | None,
                     cancel: CancelToken | None) -> AsyncResponseStream: ...


def as_output(output: Any) -> StructuredOutput:
    """``output=`` as a :class:`StructuredOutput` (built and checked now, before any request)."""
    return output if isinstance(output, StructuredOutput) else StructuredOutput(output)


def prompted(request: ChatRequest) -> ChatRequest:
    """``request`` with the schema instructions of ``prompt`` mode in its system prompt."""
    assert request.output is not None
    note = request.output.instructions()
    system = f"{request.system}\n\n{note}" if request.system else note
    return dataclasses.replace(request, system=system)


# -- the answer of one attempt ----------------------------------------------------------------------
def _output_call(response: Response) -> ToolUseBlock | None:
    return next((c for c in response.tool_calls if c.name == OUTPUT_TOOL_NAME), None)


def _as_answer(response: Response, streamed: str | None) -> Response:
    """A ``tool``-mode answer (a call of the output tool) as a text answer holding its JSON; the
    other blocks of that turn are dropped but thinking (the answer is final)."""
    call = _output_call(response)
    if call is None:
        return response
    if streamed:
        text = streamed
    elif call.arguments_error and call.raw_arguments is not None:
        text = call.raw_arguments
    else:
        text = orjson.dumps(call.arguments).decode()
    content: list[Any] = [TextBlock(text=text) if b is call else b for b in response.content
                          if not isinstance(b, (ToolUseBlock, TextBlock)) or b is call]
    stop = "end_turn" if response.stop_reason == "tool_use" else response.stop_reason
    return response.model_copy(update={"content": content, "tool_calls": [], "stop_reason": stop})


def _parsed(response: Response, spec: StructuredOutput) -> Response:
    """``response`` with ``parsed`` set; raises the :class:`OutputValidationError` of an answer
    that does not validate, or cannot whatever its text: refused, filtered or cut off."""
    text = response.text
    if response.stop_reason == "refusal":
        raise OutputValidationError(
            f"the model refused to answer: {text.strip()[:300] or '(no reason given)'}",
            text=text, code="output_refused",
            errors=[{"type": "refusal", "loc": (), "msg": "the model refused", "input": text}],
        )
    if response.stop_reason == "content_filter":
        raise OutputValidationError(
            "the provider's content filter stopped the answer", text=text, code="output_refused",
            errors=[{"type": "content_filter", "loc": (), "msg": "filtered", "input": text}],
        )
    if response.stop_reason == "max_tokens":
        raise OutputValidationError(
            f"the answer was cut off at max_tokens before its JSON was complete ({len(text)} "
            "characters arrived); bound the output type's strings and lists "
            "(Field(max_length=…)) so the whole answer fits — a larger max_tokens= mostly buys "
            "more rambling",
            text=text, code="output_truncated",
            errors=[{"type": "truncated", "loc": (), "msg": "the answer was cut off at max_tokens",
                     "input": _short(text, 200)}],
        )
    return response.model_copy(update={"parsed": spec.parse(text)})


def settle_answer(response: Response, output: Any) -> Response:
    """A whole answer to a request made with ``output=`` that cannot be asked again (a deferred
    batch row): ``response`` with ``parsed`` set, or the :class:`OutputValidationError` saying
    why not (raised, the answer as its ``partial``)."""
    spec = as_output(output)
    answer = _as_answer(response, None)
    try:
        return _parsed(answer, spec)
    except OutputValidationError as error:
        error.partial = answer
        raise


# -- one structured call: attempts, retries, the stream the caller sees -------------------------------
class _Call:
    """The state of one structured call: its attempts so far and the one streaming now."""

    def __init__(
        self,
        adapter: OutputModel,
        request: ChatRequest,
        retries: int,
        timeout: float | None,
        cancel: CancelToken | None,
    ) -> None:
        assert request.output is not None
        self.adapter = adapter
        self.request = request
        self.spec: StructuredOutput = request.output
        self.retries = retries
        self.cancel = cancel
        #: a total deadline for every attempt together
        self.timeout = timeout if timeout is not None else adapter.default_timeout
        #: the deadline and cancel switch of every attempt together, made when the first starts
        #: and handed to each attempt's model call (as its ``cancel=``)
        self.control: TurnControl | None = None
        self.messages = list(request.messages)
        self.attempt = 0
        self.inner: ResponseStream | AsyncResponseStream | None = None
        self.usage = Usage()  # of the finished attempts
        self.cost: Cost | None = None  # of the finished attempts (None: unknown)
        self.final: Response | None = None
        self.tool_parts: list[str] = []  # the output tool's arguments as they stream
        self.text_parts: list[str] = []
        self.tool_ids: set[str | None] = set()

    # -- per attempt -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def attempt_stream(self, opener: Callable[..., Any]) -> Iterator[Any]:
        """The next attempt's stream (raises when the call's time is up), opened with ``opener``
        (the adapter's ``open_stream`` or ``aopen_stream``) under the call's control, as
        :attr:`inner`. An error of the attempt carries what arrived, with every attempt's usage."""
        if self.control is None:
            self.control = TurnControl(timeout=self.timeout, cancel=self.cancel,
                                       provider=self.adapter.provider_name)
        elif self.control.expired() and self.control.outer is None:
            raise APITimeoutError(
                f"no valid structured answer within the {self.timeout:g} s timeout "
                f"({self.attempt} attempt(s)); pass a larger timeout= or try again",
                provider=self.adapter.provider_name, partial=self.snapshot(),
            )
        self.attempt += 1
        self.tool_parts, self.text_parts, self.tool_ids = [], [], set()
        request = dataclasses.replace(self.request, messages=list(self.messages))
        self.inner = opener(request, self.timeout, self.control)
        try:
            yield self.inner
        except DispatchError as exc:
            exc.partial = self.snapshot()
            raise

    def close(self) -> None:
        """The call is over: its control lets go of the caller's token."""
        if self.control is not None:
            self.control.close()

    def transform(self, delta: StreamDelta) -> StreamDelta | None:
        """The delta the caller sees: the output tool's argument fragments become text."""
        kind = delta.type
        if kind == "text_delta":
            self.text_parts.append(delta.text or "")
            return delta
        if kind == "tool_use_start" and delta.tool_name == OUTPUT_TOOL_NAME:
            self.tool_ids.add(delta.tool_call_id)
            return None
        if delta.tool_call_id in self.tool_ids and kind.startswith("tool_use"):
            fragment = delta.argument_delta or ""
            if kind == "tool_use_delta" and fragment:
                self.tool_parts.append(fragment)
                return text_delta("text_delta", fragment)
            return None
        return delta

    def snapshot(self) -> Response:
        inner = self.inner
        if inner is None:
            return Response(model=self.adapter.model_name, usage=self.usage)
        partial = _as_answer(inner.partial, "".join(self.tool_parts) or None)
        return partial.model_copy(update={"usage": self.usage + partial.usage})

    def partial_parsed(self) -> Any:
        if self.final is not None:
            return self.final.parsed
        text = "".join(self.tool_parts) if self.tool_ids else "".join(self.text_parts)
        if not text and self.inner is not None and not self.request.stream:
            return None
        return self.spec.partial(text)

    def settle(self, raw: Response) -> None:
        """The attempt ended with ``raw``: the call is done (``final`` set), or the errors go back
        to the model for another try. Raises what is left."""
        self.usage = self.usage + raw.usage
        self.cost = raw.cost if self.attempt <= 1 else add_costs(self.cost, raw.cost)
        answer = _as_answer(raw, "".join(self.tool_parts) or None)
        answer = answer.model_copy(update={"usage": self.usage, "cost": self.cost})
        if answer.tool_calls:
            self.final = answer  # the model asks for tools: a session runs them and asks again
            return
        try:
            self.final = _parsed(answer, self.spec)
            return
        except OutputValidationError as invalid:
            error = invalid
        error.partial = answer
        error.attempts = self.attempt
        error.provider = self.adapter.provider_name
        if error.code != "output_invalid" or self.attempt > self.retries:
            if self.attempt > 1:
                error.message += f" (after {self.attempt} attempts)"
                error.args = (error.message,)
            raise error
        log.info("structured output: answer %d of %s %s is not valid (%s); asking again",
                 self.attempt, self.adapter.provider_name, self.adapter.model_name, error.message)
        if answer.content:
            self.messages.append(answer.to_message())
        tool = bool(self.tool_ids) or _output_call(raw) is not None
        self.messages.append(
            Message(role="user", content=self.spec.retry_prompt(error.errors, tool=tool))
        )


class _CallAccumulator(Accumulator):
    """The accumulator a structured stream reports: the current attempt's answer (tool-mode
    answers as text, usage of every attempt) and the final, parsed one."""

    def __init__(self, call: _Call) -> None:
        super().__init__(call.adapter.model_name)
        self._call = call

    def snapshot(self) -> Response:
        return self._call.snapshot()

    def finish(self) -> Response:
        assert self._call.final is not None
        return self._call.final


def _run(call: _Call) -> Iterator[StreamDelta]:
    # Not _arun over the bridge: each attempt is already a bridged stream, and the caller's thread
    # transforms its deltas here, so partial_parsed grows with what the caller has taken (over the
    # bridge the loop thread runs ahead: tests/contract/test_structured.py, grows a partial object)
    try:
        while call.final is None:
            with call.attempt_stream(call.adapter.open_stream) as inner, contextlib.closing(inner):
                yield from filter(None, map(call.transform, inner))
                raw = inner.response
            call.settle(raw)
    finally:
        call.close()


async def _arun(call: _Call) -> AsyncIterator[StreamDelta]:
    try:
        while call.final is None:
            with call.attempt_stream(call.adapter.aopen_stream) as inner:
                async with contextlib.aclosing(inner):
                    async for delta in inner:
                        if (out := call.transform(delta)) is not None:
                            yield out
                    raw = inner.response
            call.settle(raw)
    finally:
        call.close()


class _StructuredView:
    """What both structured streams show of their call: ``output``, ``attempt``,
    ``partial_parsed``."""

    _call: _Call

    @property
    def output(self) -> StructuredOutput:
        """What the call asked for."""
        return self._call.spec

    @property
    def attempt(self) -> int:
        """Which attempt is streaming (1, then 2... after an invalid answer was sent back)."""
        return self._call.attempt

    @property
    def partial_parsed(self) -> Any:
        """The answer so far as JSON data (dicts, lists; incomplete JSON is fine), unwrapped;
        the validated object (``response.parsed``) once finished; None before anything parses."""
        return self._call.partial_parsed()


class StructuredResponseStream(_StructuredView, ResponseStream):
    """The stream of a call made with ``output=``: a :class:`ResponseStream` whose ``response``
    has ``parsed``, plus ``partial_parsed`` and ``attempt``."""

    def __init__(self, call: _Call) -> None:
        super().__init__(_run(call), _CallAccumulator(call))
        self._call = call


class AsyncStructuredResponseStream(_StructuredView, AsyncResponseStream):
    """The async twin of :class:`StructuredResponseStream`."""

    def __init__(self, call: _Call) -> None:
        super().__init__(_arun(call), _CallAccumulator(call))
        self._call = call


def open_structured(
    adapter: OutputModel,
    request: ChatRequest,
    output: Any,
    output_retries: int | None,
    timeout: float | None,
    cancel: CancelToken | None,
    *,
    asynchronous: bool = False,
) -> StructuredResponseStream | AsyncStructuredResponseStream:
    """The stream of ``request`` made with ``output=``: attempts until the answer validates (an
    :class:`AsyncStructuredResponseStream` when ``asynchronous``)."""
    if output_retries is None:
        output_retries = DEFAULT_OUTPUT_RETRIES
    elif isinstance(output_retries, bool) or not isinstance(output_retries, int) or output_retries < 0:
        raise ValueError(f"output_retries must be an integer ≥ 0, not {output_retries!r}")
    request = dataclasses.replace(request, output=as_output(output))
    adapter.output_mode(request)  # a mechanism this provider cannot use fails now, not mid-call
    call = _Call(adapter, request, output_retries, timeout, cancel)
    return AsyncStructuredResponseStream(call) if asynchronous else StructuredResponseStream(call)
