"""The adapters the contract suite runs against.

Each provider adds one :class:`Target`: how to start its wire-protocol fake and how to build its
adapter pointed at that fake. Every test in ``tests/contract/`` that asks for the ``target``,
``fake``, ``make`` or ``adapter`` fixture (``conftest.py``) then runs for every target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from dispatch_nb.adapter import Adapter

from ..fakes.anthropic import AnthropicFake
from ..fakes.canonical import CanonicalFake
from ..fakes.provider import ProviderFake, ToolCall, Turn


@dataclass
class Target:
    name: str
    make_fake: Callable[[], ProviderFake]
    #: build the adapter for a running fake; kwargs: max_tokens, max_retries, timeout
    make_adapter: Callable[..., Adapter]
    #: the model can return visible thinking with a signature that must round-trip
    supports_thinking: bool = False
    #: the provider always reports usage (llama.cpp-style servers may not)
    reports_usage: bool = True
    #: why this target cannot run here (None: it can)
    skip: Callable[[], str | None] = lambda: None
    #: answers only this wire protocol can give (built-in tool items, unknown blocks...), named
    extra_turns: Callable[[], list[tuple[str, Turn]]] = lambda: []
    #: the structured-output mechanism it must use (``test_structured.py``), when not listed there
    structured_mechanism: str | None = None


def target_fixture(targets: list[Target]) -> Any:
    """The ``target`` fixture over ``targets``: one parametrization per target, named after it,
    skipped (with the target's reason) where it cannot run here.

    ``conftest.py`` makes it over :data:`TARGETS`; a module that runs another list overrides it
    with ``target = target_fixture(ITS_TARGETS)``.
    """

    @pytest.fixture(params=targets, ids=[t.name for t in targets])
    def target(request: pytest.FixtureRequest) -> Target:
        t: Target = request.param
        reason = t.skip()
        if reason:
            pytest.skip(reason)
        return t

    return target


def only(targets: list[Target]) -> pytest.MarkDecorator:
    """Run a test for these targets only (not generated for the others, rather than skipped)."""
    return pytest.mark.parametrize("target", targets, ids=[t.name for t in targets], indirect=True)


def _fake_adapter(fake: ProviderFake, **kw: Any) -> Adapter:
    from dispatch_nb.providers.fake import CanonicalAdapter

    return CanonicalAdapter("echo", base_url=fake.base_url, **kw)


def _acme_adapter(fake: ProviderFake, **kw: Any) -> Adapter:
    """A provider added as one module (``tests/providers/acme.py``), built through the registry."""
    from dispatch_nb import connect

    from ..providers import acme  # noqa: F401  (importing it registers the provider)

    return connect("acme:acme-1", api_key="acme-test-key-0001", base_url=fake.base_url, **kw)


def _anthropic_adapter(fake: ProviderFake, **kw: Any) -> Adapter:
    from dispatch_nb.providers.anthropic import AnthropicAdapter

    key = getattr(fake, "api_key", None) or "sk-ant-test"
    return AnthropicAdapter("claude-sonnet-4-5", api_key=key, base_url=fake.base_url, **kw)


def _openai_adapter(backend: str) -> Callable[..., Adapter]:
    def make(fake: ProviderFake, **kw: Any) -> Adapter:
        from dispatch_nb.providers.openai import OpenAIAdapter

        model = "gpt-5" if backend == "official" else "smollm2"
        key = getattr(fake, "api_key", None)
        return OpenAIAdapter(model, backend=backend, base_url=fake.base_url, api_key=key, **kw)

    return make


def _openai_responses_fake() -> ProviderFake:
    from ..fakes.openai_responses import OpenAIResponsesFake

    return OpenAIResponsesFake(api_key="sk-test-contract-key")


def _openai_chat_fake() -> ProviderFake:
    from ..fakes.openai_chat import OpenAIChatFake

    return OpenAIChatFake(api_key="sk-test-contract-key")


def _llama_chat_fake() -> ProviderFake:
    from ..fakes.openai_chat import OpenAIChatFake

    return OpenAIChatFake.llama()


def _mistral_chat_fake() -> ProviderFake:
    from ..fakes.openai_chat import OpenAIChatFake

    return OpenAIChatFake.mistral()


def _anthropic_turns() -> list[tuple[str, Turn]]:
    """Real shapes the Messages API streams with block and delta types the adapter has no rule
    for (our own fixtures, from the documented shapes)."""
    from ..fakes.anthropic import COMPACTION, SERVER_TOOL_USE, WEB_SEARCH_RESULT, AnthropicTurn

    cited = {"type": "text", "text": "Lisbon is mild in May, about 22 °C.",
             "citations": [{"type": "web_search_result_location",
                            "url": "https://weather.example/lisbon", "title": "Lisbon in May",
                            "encrypted_index": "Eo8BCioIAhgBIiQ3fake",
                            "cited_text": "Mild days, around 22 °C."}]}
    return [
        ("compaction", AnthropicTurn(text="Day one: Alfama.", content=[COMPACTION, "text"])),
        ("server-tools", AnthropicTurn(thinking="Search the weather first.", text="Checking.",
                                       content=["thinking", "text", SERVER_TOOL_USE,
                                                WEB_SEARCH_RESULT, cited])),
        ("pause-turn", AnthropicTurn(text="Searching.", content=["text", SERVER_TOOL_USE],
                                     stop_reason="pause_turn")),
        # programmatic tool calling: the whole answer inside message_start, no block events
        ("message-start-holds-content", AnthropicTurn(
            text="Running it.", content=["text", "tools"], start_holds_content=True,
            tool_calls=[ToolCall("toolu_ptc", "get_weather", {"city": "Oslo"})])),
    ]


def _responses_turns() -> list[tuple[str, Turn]]:
    """Output items of built-in tools, compaction, and reasoning done events out of order."""
    from ..fakes.openai_responses import (
        CODE_INTERPRETER_CALL,
        COMPACTION,
        FILE_SEARCH_CALL,
        IMAGE_GENERATION_CALL,
        MCP_APPROVAL_REQUEST,
        MCP_CALL,
        MCP_LIST_TOOLS,
        WEB_SEARCH_CALL,
        ResponsesTurn,
    )

    later = {"type": "reasoning",
             "summary": [{"type": "summary_text", "text": "The search answered it."}]}
    return [
        ("web-search", ResponsesTurn(thinking="I should search.", text="Sunny, 24 °C.",
                                     output=["thinking", WEB_SEARCH_CALL, later, "text"])),
        ("every-builtin", ResponsesTurn(
            text="Done.", output=[FILE_SEARCH_CALL, CODE_INTERPRETER_CALL, IMAGE_GENERATION_CALL,
                                  MCP_LIST_TOOLS, MCP_CALL, "text", MCP_APPROVAL_REQUEST])),
        ("compaction", ResponsesTurn(thinking="Go on.", text="Continuing.",
                                     output=[COMPACTION, "thinking", "text"])),
        ("late-reasoning-done", ResponsesTurn(
            text="Both cities.", late_reasoning_done=True,
            tool_calls=[ToolCall("call_l", "get_weather", {"city": "Lima"})],
            output=[{"type": "reasoning"}, "text", {"type": "reasoning"}, "tools"])),
    ]


def _mistral_turns() -> list[tuple[str, Turn]]:
    from ..fakes.openai_chat import REFERENCE_PART, ChatTurn

    return [
        ("thinking-parts", Turn(thinking="Okay, the user asks how to cross the street.",
                                text="Look both ways.")),
        ("thinking-parts-and-unknown", ChatTurn(thinking="Check the sources.",
                                                text="Per the sources, yes.",
                                                parts=[REFERENCE_PART])),
    ]


def _copilot_fake() -> ProviderFake:
    from ..fakes.copilot import CopilotFake

    return CopilotFake()


def _copilot_adapter(model: str) -> Callable[..., Adapter]:
    def make(fake: ProviderFake, **kw: Any) -> Adapter:
        from dispatch_nb.providers.copilot import CopilotAdapter

        github = fake.github  # type: ignore[attr-defined]
        return CopilotAdapter(model, github_token=github.github_token,
                              github_url=github.github_url, github_api_url=github.api_url, **kw)

    return make


TARGETS: list[Target] = [
    Target("fake", CanonicalFake, _fake_adapter, supports_thinking=True),
    # a provider added by one module, one registration and this one line (tests/providers/acme.py)
    Target("acme", CanonicalFake, _acme_adapter, supports_thinking=True,
           structured_mechanism="canonical"),
    Target("anthropic", AnthropicFake, _anthropic_adapter, supports_thinking=True,
           extra_turns=_anthropic_turns),
    Target("openai-responses", _openai_responses_fake, _openai_adapter("official"),
           supports_thinking=True, extra_turns=_responses_turns),
    Target("openai-compatible", _openai_chat_fake, _openai_adapter("compatible")),
    # llama-cpp-python's quirks: repeated tool ids, no usage, pings, strict templates, no key
    Target("openai-compatible-llama", _llama_chat_fake, _openai_adapter("compatible"),
           reports_usage=False),
    # Mistral: content as a list of parts, reasoning in thinking parts (no signature); not named
    # "openai": its assistant thinking parts are Mistral's wire format, not OpenAI's request schema
    Target("compatible-mistral", _mistral_chat_fake, _openai_adapter("compatible"),
           extra_turns=_mistral_turns),
    # GitHub Copilot: token exchange on a fake GitHub, Claude's stream quirks, reasoning_opaque
    Target("copilot", _copilot_fake, _copilot_adapter("claude-sonnet-4"), supports_thinking=True),
    # a model whose supported_endpoints list only /responses
    Target("copilot-responses", _copilot_fake, _copilot_adapter("gpt-5-codex"),
           supports_thinking=True, extra_turns=_responses_turns),
]
