"""What every provider fake does about structured output (``output=``), in one place.

The fakes (:class:`~tests.fakes.provider.ProviderFake`) call three functions:

* :func:`check_request` refuses what the real APIs refuse about structured output, before any
  answer: OpenAI's strict ``json_schema`` rules (an object root, ``additionalProperties: false``
  and every property ``required`` in each object, no unsupported keywords such as ``minLength``
  or ``default``, a valid ``name``), Anthropic's ``output_config`` rules (``additionalProperties:
  false`` on every object, no recursion, no numeric or length constraints) and its "no forced tool
  with thinking" rule, and llama-cpp-python's server, which only takes ``response_format`` of type
  ``text`` / ``json_object`` (otherwise a 500 holding the validation error, as the real one does).
* :func:`shape_turn` renders a scripted answer the way the request asked for it: when the request
  declares the output tool (:data:`~dispatch_nb.structured.OUTPUT_TOOL_NAME`) and the scripted
  turn holds the answer's JSON as text, the model "calls" that tool with it instead.
* :func:`default_answer` is what a fake answers unscripted to a structured request: JSON built
  from the requested schema (:func:`example_for`), so notebook tests get schema-valid answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dispatch_nb.structured import OUTPUT_TOOL_NAME

from .provider import Fail, ToolCall, Turn
from .server import Reply

__all__ = ["check_request", "default_answer", "example_for", "mechanism_of", "requested_schema",
           "shape_turn"]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: keywords OpenAI's strict mode refuses ("... is not permitted")
_OPENAI_NOT_PERMITTED = frozenset({
    "minLength", "maxLength", "uniqueItems", "default", "patternProperties", "allOf", "not",
    "if", "then", "else", "oneOf", "minProperties", "maxProperties", "propertyNames",
    "unevaluatedProperties", "contains", "prefixItems", "discriminator", "examples",
})
#: constraints Anthropic's structured outputs refuse
_ANTHROPIC_NOT_SUPPORTED = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
    "maxLength", "maxItems", "uniqueItems", "patternProperties", "not", "if", "then", "else",
})


# -- what a request asks for ------------------------------------------------------------------------
def _output_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The output tool's schema when the request declares it (any protocol's tool shape)."""
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if fn.get("name") == OUTPUT_TOOL_NAME:
            schema = fn.get("parameters") or fn.get("input_schema")
            return schema if isinstance(schema, dict) else {}
    return None


def requested_schema(body: Any) -> dict[str, Any] | None:
    """The JSON Schema a request asks the answer to follow, whatever its protocol: Responses
    ``text.format``, chat ``response_format`` (``json_schema`` or llama's ``json_object`` +
    ``schema``), Anthropic ``output_config.format``, the canonical ``output``, or the output
    tool's parameters."""
    if not isinstance(body, dict):
        return None
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return fmt.get("schema")
    rf = body.get("response_format")
    if isinstance(rf, dict):
        if rf.get("type") == "json_schema":
            return (rf.get("json_schema") or {}).get("schema")
        if rf.get("type") == "json_object" and isinstance(rf.get("schema"), dict):
            return rf["schema"]
    oc = body.get("output_config")
    if isinstance(oc, dict) and isinstance(oc.get("format"), dict):
        return oc["format"].get("schema")
    out = body.get("output")
    if isinstance(out, dict) and isinstance(out.get("schema"), dict):
        return out["schema"]
    return _output_tool(body)


def mechanism_of(body: Any) -> str | None:
    """How a request asks for structured output: ``text.format``, ``response_format``,
    ``json_object``, ``output_config``, ``canonical``, ``tool`` (the output tool is declared), or
    None."""
    if not isinstance(body, dict):
        return None
    if _output_tool(body) is not None:
        return "tool"
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return "text.format"
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        return "response_format"
    if isinstance(rf, dict) and rf.get("type") == "json_object" and "schema" in rf:
        return "json_object"
    if isinstance(body.get("output_config"), dict):
        return "output_config"
    if isinstance(body.get("output"), dict):
        return "canonical"
    return None


# -- what the real APIs refuse ----------------------------------------------------------------------
def _walk(node: Any, where: tuple[str, ...] = ()) -> Any:
    """Every sub-schema of ``node`` with its path."""
    if not isinstance(node, dict):
        return
    yield where, node
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from _walk(sub, (*where, key, name))
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from _walk(sub, (*where, key, str(i)))
    for key in ("items", "additionalProperties", "not", "if", "then", "else"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], (*where, key))


def _openai_strict_problem(schema: Any, what: str) -> str | None:
    if not isinstance(schema, dict):
        return f"Invalid schema for {what}: schema must be a JSON Schema object"
    if schema.get("type") != "object" or "anyOf" in schema:
        return f"Invalid schema for {what}: schema must be a JSON Schema of 'type: \"object\"', " \
               "got something else"
    for where, node in _walk(schema):
        context = f"context=({', '.join(repr(w) for w in where)})"
        bad = sorted(_OPENAI_NOT_PERMITTED & node.keys())
        if bad:
            return f"Invalid schema for {what}: In {context}, '{bad[0]}' is not permitted."
        if node.get("type") == "object" or "properties" in node:
            if node.get("additionalProperties") is not False:
                return (f"Invalid schema for {what}: In {context}, 'additionalProperties' is "
                        "required to be supplied and to be false.")
            keys = list(node.get("properties") or {})
            missing = [k for k in keys if k not in (node.get("required") or [])]
            if missing:
                return (f"Invalid schema for {what}: In {context}, 'required' is required to be "
                        "supplied and to be an array including every key in properties. "
                        f"Missing '{missing[0]}'.")
    return None


def _openai_problem(body: dict[str, Any]) -> str | None:
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    rf = body.get("response_format")
    spec: dict[str, Any] | None = None
    what = ""
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec, what = fmt, f"text.format '{fmt.get('name')}'"
    elif isinstance(rf, dict) and rf.get("type") == "json_schema":
        spec = rf.get("json_schema") if isinstance(rf.get("json_schema"), dict) else {}
        what = f"response_format '{spec.get('name')}'"
    if spec is not None:
        if not isinstance(spec.get("name"), str) or not _NAME.match(spec["name"]):
            return f"Invalid 'name' for {what}: must match ^[a-zA-Z0-9_-]{{1,64}}$"
        if not isinstance(spec.get("schema"), dict):
            return f"Missing required parameter: schema of {what}"
        if spec.get("strict") is True:
            return _openai_strict_problem(spec["schema"], what)
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("type") == "function" and tool.get("strict") is True:
            fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            problem = _openai_strict_problem(fn.get("parameters"), f"function '{fn.get('name')}'")
            if problem:
                return problem
    return None


def _recursive(schema: dict[str, Any]) -> bool:
    defs = {f"#/$defs/{k}": v for k, v in (schema.get("$defs") or {}).items()}
    defs.update({f"#/definitions/{k}": v for k, v in (schema.get("definitions") or {}).items()})
    defs["#"] = schema

    def refs(node: Any) -> set[str]:
        found: set[str] = set()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                found.add(node["$ref"])
            for key, value in node.items():
                if key not in ("$defs", "definitions"):
                    found |= refs(value)
        elif isinstance(node, list):
            for value in node:
                found |= refs(value)
        return found

    def visit(ref: str, path: tuple[str, ...]) -> bool:
        if ref in path:
            return True
        return any(visit(r, (*path, ref)) for r in refs(defs.get(ref)) if r in defs or r == "#")

    return visit("#", ())


def _anthropic_problem(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    thinking = body.get("thinking")
    if (isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
            and isinstance(choice, dict) and choice.get("type") in ("any", "tool")):
        return "Thinking may not be enabled when tool_choice forces tool use."
    oc = body.get("output_config")
    if not isinstance(oc, dict) or "format" not in oc:
        return None
    fmt = oc["format"]
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or \
            not isinstance(fmt.get("schema"), dict):
        return "output_config.format: Input tag does not match the expected tag 'json_schema'"
    schema = fmt["schema"]
    if _recursive(schema):
        return "output_config.format.schema: recursive schemas are not supported"
    for where, node in _walk(schema):
        path = ".".join(where) or "(root)"
        bad = sorted(_ANTHROPIC_NOT_SUPPORTED & node.keys())
        if bad:
            return f"output_config.format.schema at {path}: '{bad[0]}' is not supported"
        if (node.get("type") == "object" or "properties" in node) and \
                node.get("additionalProperties") is not False:
            return (f"output_config.format.schema at {path}: For 'object' type, "
                    "'additionalProperties' must be explicitly set to false")
    return None


def check_request(fake: Any, body: Any) -> Fail | Reply | None:
    """What the real API answers a structured request it refuses (None: it takes it)."""
    if not isinstance(body, dict):
        return None
    kinds = {cls.__name__ for cls in type(fake).__mro__}  # a test's subclass is its fake too
    if "AnthropicFake" in kinds:
        problem = _anthropic_problem(body)
        return Fail(400, problem, "invalid_request_error") if problem else None
    if kinds & {"OpenAIChatFake", "OpenAIResponsesFake", "CopilotFake"}:
        rf = body.get("response_format")
        if getattr(fake, "llama_errors", False) and isinstance(rf, dict) and \
                rf.get("type") not in ("text", "json_object"):
            # llama-cpp-python's server (0.3.x): its body model only knows text / json_object;
            # the validation error comes back as a 500 (as captured from the real server)
            detail = {"type": "literal_error", "loc": ("body", "response_format", "type"),
                      "msg": "Input should be 'text' or 'json_object'", "input": rf.get("type"),
                      "ctx": {"expected": "'text' or 'json_object'"}}
            return Reply.json({"error": {
                "message": f"1 validation error:\n  {detail!r}\n\n  File \"llama_cpp/server/"
                           "app.py\", line 376, in create_chat_completion\n    POST "
                           "/v1/chat/completions",
                "type": "internal_server_error", "param": None, "code": None,
            }}, status=500)
        problem = _openai_problem(body)
        return Fail(400, problem, "invalid_request_error") if problem else None
    return None


# -- answering ---------------------------------------------------------------------------------------
def shape_turn(turn: Turn, body: Any) -> Turn:
    """``turn`` as the model would answer a request in ``tool`` mode: the scripted JSON text
    becomes a call of the output tool (a refusal stays text)."""
    if not isinstance(body, dict) or _output_tool(body) is None:
        return turn
    if turn.tool_calls or not turn.text or turn.canonical_stop in ("refusal", "content_filter"):
        return turn
    try:
        arguments: dict[str, Any] | str = json.loads(turn.text)
    except ValueError:
        arguments = turn.text  # invalid or cut short: sent as it is
    if not isinstance(arguments, dict):
        arguments = turn.text
    call = ToolCall(id=f"call_out_{len(turn.text):04d}", name=OUTPUT_TOOL_NAME,
                    arguments=arguments)
    stop = "max_tokens" if turn.canonical_stop == "max_tokens" else None
    return Turn(**{**turn.__dict__, "text": "", "tool_calls": [call], "stop_reason": stop})


def example_for(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A small value valid for ``schema`` (enums: the first value; arrays: one item)."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 8:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            target = target.get(part) if isinstance(target, dict) else None
        return example_for(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        options = [s for s in schema.get(key) or [] if s.get("type") != "null"]
        if options:
            return example_for(options[0], root, depth + 1)
    if schema.get("allOf"):
        return example_for(schema["allOf"][0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        return {name: example_for(sub, root, depth + 1)
                for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems") or 1))
        return [example_for(schema.get("items") or {}, root, depth + 1) for _ in range(count)]
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "string":
        return {"date-time": "2025-01-01T00:00:00Z", "date": "2025-01-01", "email": "a@b.example",
                "uuid": "00000000-0000-4000-8000-000000000000"}.get(schema.get("format"), "text")
    return "text"


def default_answer(body: Any) -> Turn | None:
    """The unscripted answer to a structured request: JSON valid for its schema (None for a
    request without one)."""
    schema = requested_schema(body)
    if schema is None:
        return None
    return Turn(text=json.dumps(example_for(schema)))
