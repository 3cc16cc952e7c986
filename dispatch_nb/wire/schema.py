"""JSON Schema walking that the wire formats' dialects (:mod:`dispatch_nb.wire.openai_schema`,
:func:`dispatch_nb.wire.anthropic.anthropic_schema`) and :mod:`dispatch_nb.structured` share: every
sub-schema, ``$ref`` resolution, recursion, notes of dropped constraints in a description."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["NOT_STRICT", "is_object_root", "is_recursive", "map_schema", "nullable", "resolver",
           "with_note"]

_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE_KEYS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
             "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems")


def map_schema(node: Any, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """A copy of schema ``node`` with ``fn`` applied to every sub-schema, innermost first."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _MAP_KEYS:
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = {name: map_schema(sub, fn) for name, sub in value.items()}
    for key in _LIST_KEYS:
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [map_schema(sub, fn) for sub in value]
    for key in _ONE_KEYS:
        value = out.get(key)
        if isinstance(value, dict):
            out[key] = map_schema(value, fn)
        elif key == "items" and isinstance(value, list):
            out[key] = [map_schema(sub, fn) for sub in value]
    return fn(out)


def _refs_in(node: Any) -> Iterator[str]:
    """Every ``$ref`` in ``node``, not looking inside ``$defs`` / ``definitions``."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for key, value in node.items():
            if key in ("$defs", "definitions"):
                continue
            if key in _MAP_KEYS and isinstance(value, dict):
                for sub in value.values():
                    yield from _refs_in(sub)
            elif isinstance(value, (dict, list)):
                yield from _refs_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs_in(item)


def resolver(root: Mapping[str, Any]) -> Callable[[str], Any]:
    def resolve(ref: str) -> Any:
        if ref == "#":
            return root
        if not ref.startswith("#/"):
            return None
        node: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    return resolve


def is_recursive(schema: Mapping[str, Any]) -> bool:
    """Whether following the ``$ref`` s of ``schema`` can lead back to where they started."""
    resolve = resolver(schema)

    def visit(node: Any, path: tuple[str, ...]) -> bool:
        for ref in set(_refs_in(node)):
            if ref in path:
                return True
            target = resolve(ref)
            if target is not None and visit(target, (*path, ref)):
                return True
        return False

    return visit(schema, ("#",))


def nullable(node: Any, resolve: Callable[[str], Any] | None = None) -> bool:
    if not isinstance(node, dict):
        return node is True or node == {}
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if "enum" in node and None in node["enum"]:
        return True
    if "const" in node and node["const"] is None:
        return True
    for key in ("anyOf", "oneOf"):
        if any(nullable(sub, resolve) for sub in node.get(key) or []):
            return True
    if not node or set(node) <= {"description", "title", "default", "examples"}:
        return True  # anything goes
    ref = node.get("$ref")
    if isinstance(ref, str) and resolve is not None:
        target = resolve(ref)
        if target is not None and target is not node:
            return nullable(target)
    return False


def is_object_root(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    composite = any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref", "enum", "const"))
    return (kind == "object" or (kind is None and "properties" in schema)) and not composite


def with_note(node: dict[str, Any], dropped: dict[str, Any]) -> dict[str, Any]:
    if dropped:
        note = "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in dropped.items()) + "}"
        description = node.get("description")
        node["description"] = f"{description} {note}" if description else note
    return node


#: keywords neither strict OpenAI schemas nor Anthropic's can express
NOT_STRICT = frozenset({"not", "if", "then", "else", "patternProperties", "dependentSchemas",
                         "dependentRequired", "propertyNames", "unevaluatedProperties",
                         "unevaluatedItems", "contains", "prefixItems", "additionalItems"})
