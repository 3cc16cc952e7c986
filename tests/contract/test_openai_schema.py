"""Every request body the two OpenAI paths produce conforms to OpenAI's published request schemas.

The OpenAI fakes check each chat request they receive against ``CreateResponse`` or
``CreateChatCompletionRequest`` (``tests/fakes/openai_schema.py``) while the contract suites
(``test_contract.py``, ``test_downstream.py``, ``test_real_shapes.py``) and the OpenAI provider
tests run for the OpenAI targets (:data:`CHECKED_SUITES`, switched on in ``tests/conftest.py``); a
body off the schema fails the test that sent it. This module checks the checker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from dispatch_nb import ServerError
from dispatch_nb.providers.openai import OpenAIAdapter

from ..conftest import CHECKED_SUITES, checks_openai_bodies
from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.openai_schema import REPO, SCHEMA_FOR, SPEC, checking, problems
from ..fakes.server import take_handler_errors


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


def test_the_suites_that_send_openai_requests_are_checked(request: pytest.FixtureRequest) -> None:
    assert len(CHECKED_SUITES) >= 6
    assert all((REPO / suite).is_file() for suite in CHECKED_SUITES)  # none renamed away
    assert all(checks_openai_bodies(f"{suite}::test_x[openai-responses]") for suite in CHECKED_SUITES)
    assert checks_openai_bodies("tests/providers/test_openai_chat.py::test_x")
    assert not checks_openai_bodies("tests/contract/test_contract.py::test_x[anthropic]")
    assert not checks_openai_bodies("tests/core/test_cache.py::test_openai_x")
    assert checking.is_set() == checks_openai_bodies(request.node.nodeid)


@pytest.fixture
def checked() -> Iterator[None]:
    checking.set()
    yield
    checking.clear()


def test_a_body_off_the_schema_fails_the_test_that_sent_it(checked: None) -> None:
    with OpenAIChatFake() as fake:
        adapter = OpenAIAdapter("smollm2", backend="compatible", base_url=fake.base_url,
                                max_retries=0)
        assert adapter.chat("hi").text  # a body dispatch_nb builds conforms
        assert take_handler_errors() == []
        # one that does not (max_tokens must be an integer) is a crash of the fake: a 500 here,
        # and the test that sent it fails at its teardown with the schema's complaint
        with pytest.raises(ServerError) as info:
            adapter.chat("hi", extra_body={"max_completion_tokens": "many"})
        assert info.value.status_code == 500
    crashes = take_handler_errors()
    assert len(crashes) == 1 and "off OpenAI's schema" in crashes[0]
    assert "max_completion_tokens" in crashes[0]
