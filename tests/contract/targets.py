"""The adapters the contract suite runs against.

Each provider adds one :class:`Target`: how to start its wire-protocol fake and how to build its
adapter pointed at that fake. Every test in ``test_contract.py`` then runs for every target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dispatch_nb.adapter import Adapter

from ..fakes.anthropic import AnthropicFake
from ..fakes.canonical import CanonicalFake
from ..fakes.provider import ProviderFake


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


def _fake_adapter(fake: ProviderFake, **kw: Any) -> Adapter:
    from dispatch_nb.providers.fake import FakeAdapter

    return FakeAdapter("echo", base_url=fake.base_url, **kw)


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

    return OpenAIResponsesFake(api_key="sk-test")


def _openai_chat_fake() -> ProviderFake:
    from ..fakes.openai_chat import OpenAIChatFake

    return OpenAIChatFake(api_key="sk-test")


def _llama_chat_fake() -> ProviderFake:
    from ..fakes.openai_chat import OpenAIChatFake

    return OpenAIChatFake.llama()


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
    Target("anthropic", AnthropicFake, _anthropic_adapter, supports_thinking=True),
    Target("openai-responses", _openai_responses_fake, _openai_adapter("official"),
           supports_thinking=True),
    Target("openai-compatible", _openai_chat_fake, _openai_adapter("compatible")),
    # llama-cpp-python's quirks: repeated tool ids, no usage, pings, strict templates, no key
    Target("openai-compatible-llama", _llama_chat_fake, _openai_adapter("compatible"),
           reports_usage=False),
    # GitHub Copilot: token exchange on a fake GitHub, Claude's stream quirks, reasoning_opaque
    Target("copilot", _copilot_fake, _copilot_adapter("claude-sonnet-4"), supports_thinking=True),
    # a model whose supported_endpoints list only /responses
    Target("copilot-responses", _copilot_fake, _copilot_adapter("gpt-5-codex"),
           supports_thinking=True),
]
