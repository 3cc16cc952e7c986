"""OpenAI's published request schemas, as the OpenAI fakes check every body they receive.

Each chat request an OpenAI fake receives while :data:`checking` is on is validated against
``CreateResponse`` or ``CreateChatCompletionRequest`` in ``tests/specs/openai.openapi.json``
(OpenAI's published spec, vendored so that every clone validates), with the relaxations
``tests/specs/README.md`` lists for the ways the spec is stricter than the API. A body off the
schema is a crash of the fake, which fails the test that sent it (``tests/conftest.py``).
``tests/conftest.py`` turns the check on for the contract suites and the OpenAI provider tests.
"""

from __future__ import annotations

import copy
import json
import threading
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

__all__ = ["SCHEMA_FOR", "SPEC", "check_body", "checking", "problems"]

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "tests" / "specs" / "openai.openapi.json"
SPEC_URI = "urn:dispatch-nb:openai-openapi"
SCHEMA_FOR = {"/chat/completions": "CreateChatCompletionRequest", "/responses": "CreateResponse"}
#: component → required properties real clients may omit (specs/README.md)
OPTIONAL_IN_PRACTICE = {
    "OutputMessage": {"id", "status", "type"},
    "OutputTextContent": {"annotations", "logprobs"},
    "InputImageContent": {"detail"},
}


def _relax(node: Any) -> None:
    """``nullable: true`` beside a ``type`` admits null; ``oneOf`` is read as ``anyOf``."""
    if isinstance(node, dict):
        if node.get("nullable") is True and "type" in node:
            types = node["type"] if isinstance(node["type"], list) else [node["type"]]
            node["type"] = [*types, "null"] if "null" not in types else types
            if isinstance(node.get("enum"), list) and None not in node["enum"]:
                node["enum"].append(None)
        if "oneOf" in node:
            alternatives = node.pop("oneOf")
            if "anyOf" in node:
                node.setdefault("allOf", []).append({"anyOf": alternatives})
            else:
                node["anyOf"] = alternatives
        for value in node.values():
            _relax(value)
    elif isinstance(node, list):
        for value in node:
            _relax(value)


@cache
def validator(component: str) -> Draft202012Validator:
    spec = copy.deepcopy(json.loads(SPEC.read_text(encoding="utf-8")))
    _relax(spec)
    schemas = spec["components"]["schemas"]
    for name, optional in OPTIONAL_IN_PRACTICE.items():
        schemas[name]["required"] = [r for r in schemas[name].get("required", [])
                                     if r not in optional]
    registry = Registry().with_resource(
        SPEC_URI, Resource.from_contents(spec, default_specification=DRAFT202012)
    )
    return Draft202012Validator(
        {"$ref": f"{SPEC_URI}#/components/schemas/{component}"}, registry=registry
    )


def problems(endpoint: str, body: dict[str, Any]) -> str | None:
    error = best_match(validator(SCHEMA_FOR[endpoint]).iter_errors(body))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{endpoint} at {where or '(root)'}: {error.message[:300]}"




#: on while a test whose requests must conform runs (set by ``tests/conftest.py``)
checking = threading.Event()


def check_body(endpoint: str, body: dict[str, Any]) -> None:
    """Raise when ``body`` (sent to ``endpoint``) is off OpenAI's schema and the check is on."""
    if checking.is_set():
        problem = problems(endpoint, body)
        if problem is not None:
            raise AssertionError(f"the request body is off OpenAI's schema: {problem}\n"
                                 f"  body: {json.dumps(body)[:1500]}")
