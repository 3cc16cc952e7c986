"""Every request body the two OpenAI paths produce conforms to OpenAI's published request schemas.

The contract suites (``test_contract.py``, ``test_downstream.py``) and the OpenAI provider tests are
re-run for the OpenAI targets in a subprocess with :data:`RECORD_BODIES_ENV` set, so the fakes
record every body they receive; each is then validated against ``CreateResponse`` or
``CreateChatCompletionRequest`` in ``tests/specs/openai.openapi.json`` (OpenAI's published spec,
vendored so that every clone validates), with the relaxations ``tests/specs/README.md`` lists for
the ways the spec is stricter than the API.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from ..fakes.openai_chat import RECORD_BODIES_ENV

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "tests" / "specs" / "openai.openapi.json"
SPEC_URI = "urn:dispatch-nb:openai-openapi"
SCHEMA_FOR = {"/chat/completions": "CreateChatCompletionRequest", "/responses": "CreateResponse"}
SUITES = [
    "tests/contract/test_contract.py",
    "tests/contract/test_downstream.py",
    "tests/contract/test_real_shapes.py",
    "tests/providers/test_openai_chat.py",
    "tests/providers/test_openai_responses.py",
    "tests/providers/test_openai.py",
]

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


def test_the_vendored_spec_is_openais() -> None:
    spec = json.loads(SPEC.read_text(encoding="utf-8"))
    assert spec["openapi"].startswith("3.") and "OpenAI" in spec["info"]["title"]
    assert set(SCHEMA_FOR.values()) <= set(spec["components"]["schemas"])


def test_validator_is_not_vacuous() -> None:
    good = {"model": "gpt-5", "input": [{"type": "message", "role": "user",
                                         "content": [{"type": "input_text", "text": "hi"}]}]}
    assert problems("/responses", good) is None
    assert problems("/responses", {**good, "max_output_tokens": "many"})
    assert problems("/responses", {**good, "tools": [{"type": "function", "function": {}}]})
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert problems("/chat/completions", chat) is None
    assert problems("/chat/completions", {**chat, "messages": []})
    assert problems("/chat/completions", {**chat, "messages": [{"role": "tool", "content": "x"}]})


def test_every_recorded_request_body_conforms(tmp_path: Path) -> None:
    record = tmp_path / "bodies.jsonl"
    env = {**os.environ, RECORD_BODIES_ENV: str(record)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES, "-k", "openai"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, f"the recorded suites failed:\n{run.stdout[-4000:]}"
    lines = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    counts = {endpoint: sum(1 for r in lines if r["endpoint"] == endpoint) for endpoint in SCHEMA_FOR}
    assert counts["/responses"] >= 50 and counts["/chat/completions"] >= 50, counts
    found: dict[str, str] = {}
    for record_line in lines:
        problem = problems(record_line["endpoint"], record_line["body"])
        if problem is not None:
            found.setdefault(problem, json.dumps(record_line["body"])[:1500])
    assert not found, "\n\n".join(f"{p}\n  body: {b}" for p, b in found.items())
