"""OpenAI's JSON Schema dialect: strict Structured Outputs, for chat.completions and Responses.

:func:`openai_strict_schema` rewrites a schema the way OpenAI's strict mode requires;
:func:`openai_output_schema` is what both OpenAI wire formats send for ``output=``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .request import OutputSpec
from .schema import NOT_STRICT, is_object_root, is_recursive, map_schema, nullable, resolver, with_note

__all__ = ["openai_json_schema", "openai_output_schema", "openai_strict_schema"]

_OPENAI_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname",
                             "ipv4", "ipv6", "uuid"})
#: keywords OpenAI's strict mode honours (everything else is dropped or makes it non-strict)
_OPENAI_KEEP = frozenset({
    "type", "description", "title", "enum", "const", "anyOf", "$ref", "$defs", "definitions",
    "properties", "required", "additionalProperties", "items", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minItems", "maxItems",
})
#: constraints OpenAI does not enforce: dropped, noted in the description, checked by us
_OPENAI_NOTE = frozenset({"minLength", "maxLength", "uniqueItems", "minProperties",
                          "maxProperties"})


class _NotStrict(Exception):
    pass


def openai_strict_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` made strict the way OpenAI's Structured Outputs require (the rewrite is
    described in docs/structured-output.md), or None when it cannot be (a map type, ``not``,
    ``if``, ``patternProperties``...: then it is sent with ``strict: false``)."""
    root = copy.deepcopy(dict(schema))
    resolve = resolver(root)

    def strict(node: dict[str, Any]) -> dict[str, Any]:
        if NOT_STRICT & node.keys():
            raise _NotStrict
        if "allOf" in node:
            parts = node.pop("allOf")
            if len(parts) != 1 or not isinstance(parts[0], dict):
                raise _NotStrict
            node = {**parts[0], **node}
        if "oneOf" in node:
            node["anyOf"] = [*node.get("anyOf", []), *node.pop("oneOf")]
        ref = node.get("$ref")
        if isinstance(ref, str) and len(node) > 1:
            target = resolve(ref)
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            if isinstance(target, dict) and not is_recursive({**root, "$ref": ref}):
                node = {**strict(copy.deepcopy(target)), **siblings}
            else:
                node = {"$ref": ref}  # a recursive reference keeps no siblings
        dropped = {k: node.pop(k) for k in sorted(_OPENAI_NOTE & node.keys())}
        if node.get("format") is not None and node["format"] not in _OPENAI_FORMATS:
            dropped["format"] = node.pop("format")
        for key in [k for k in node if k not in _OPENAI_KEEP]:
            del node[key]
        kind = node.get("type")
        if kind == "object" or "properties" in node:
            extra = node.get("additionalProperties")
            properties = node.get("properties") or {}
            if isinstance(extra, dict) and extra:
                raise _NotStrict  # a map: no fixed set of keys to require
            if extra is True and not properties:
                raise _NotStrict
            required = set(node.get("required") or [])
            fixed: dict[str, Any] = {}
            for name, sub in properties.items():
                if name not in required and not nullable(sub, resolve):
                    sub = {"anyOf": [sub, {"type": "null"}]}
                fixed[name] = sub
            node["properties"] = fixed
            node["required"] = list(fixed)
            node["additionalProperties"] = False
            node.setdefault("type", "object")
        return with_note(node, dropped)

    try:
        out = map_schema(root, strict)
    except _NotStrict:
        return None
    if not isinstance(out, dict) or not is_object_root(out):
        return None
    return out


def openai_output_schema(output: OutputSpec) -> tuple[dict[str, Any], bool]:
    """``(schema, strict)`` for OpenAI's ``json_schema`` formats and strict tools: strict when
    the schema can be (``output.strict`` None), never (False), or a ``ValueError`` (True)."""
    if output.strict is False:
        return output.schema, False
    made = openai_strict_schema(output.schema)
    if made is None:
        if output.strict:
            raise ValueError(
                f"output schema {output.name!r} cannot be made strict for OpenAI (a map type, "
                "not/if/patternProperties...); pass strict=None to send it non-strict"
            )
        return output.schema, False
    return made, True


def openai_json_schema(output: OutputSpec) -> dict[str, Any]:
    """``name``, ``schema``, ``strict`` and ``description`` of a ``json_schema`` format for
    ``output`` (chat.completions nests them in ``json_schema``, Responses does not)."""
    schema, strict = openai_output_schema(output)
    spec: dict[str, Any] = {"name": output.name, "schema": schema, "strict": strict}
    if output.description:
        spec["description"] = output.description
    return spec
