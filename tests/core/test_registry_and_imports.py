"""Registry, model specs, the public surface, and a light ``import dispatch_nb``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import dispatch_nb
from dispatch_nb import (
    Adapter,
    RequestError,
    connect,
    get_provider,
    list_providers,
    register_provider,
)
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.registry import parse_model_spec

DESIGN_NAMES = {
    "TextBlock", "ImageBlock", "ToolUseBlock", "ToolResultBlock", "ThinkingBlock",
    "RedactedThinkingBlock", "Message", "ToolDefinition", "Usage", "Response", "StreamDelta",
    "StreamEvent", "ModelInfo", "Adapter", "CopilotAdapter", "OpenAIAdapter", "AnthropicAdapter",
    "LocalAdapter", "connect", "register_provider", "get_provider", "list_providers", "Session",
    "tool", "CancelToken", "DispatchError", "AuthenticationError", "RateLimitError", "ServerError",
    "RequestError", "ContextLengthError", "ModelUnavailableError", "APIConnectionError",
    "APITimeoutError", "RequestCancelled", "load_ipython_extension",
}


def test_public_surface_contains_the_design_names() -> None:
    assert set(dispatch_nb.__all__) >= DESIGN_NAMES
    assert sorted(dispatch_nb.__all__) == dispatch_nb.__all__


def test_every_public_core_name_resolves() -> None:
    for name in ["Response", "connect", "CancelToken", "DispatchError", "Adapter"]:
        assert getattr(dispatch_nb, name) is not None
    with pytest.raises(AttributeError):
        dispatch_nb.NotAName  # noqa: B018


def test_import_is_light() -> None:
    code = (
        "import sys, json, dispatch_nb; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('IPython','ipywidgets','httpx','pydantic','llama_cpp') or m.startswith('dispatch_nb.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_parse_model_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISPATCH_NB_MODEL", raising=False)
    assert parse_model_spec("openai:gpt-4.1") == ("openai", "gpt-4.1")
    assert parse_model_spec("gpt-4.1") == ("copilot", "gpt-4.1")
    assert parse_model_spec("compatible:llama3:8b") == ("compatible", "llama3:8b")
    assert parse_model_spec("llama3:8b") == ("copilot", "llama3:8b")
    monkeypatch.setenv("DISPATCH_NB_MODEL", "anthropic:claude-sonnet-4-5")
    assert parse_model_spec("claude-haiku-4-5") == ("anthropic", "claude-haiku-4-5")
    with pytest.raises(RequestError, match=r"available providers: .*anthropic.*openai") as info:
        parse_model_spec("nosuch:model")
    assert info.value.code == "unknown_provider"
    with pytest.raises(RequestError, match="no model") as info:
        parse_model_spec("openai:")
    assert info.value.code == "invalid_request"
    with pytest.raises(RequestError) as info:
        parse_model_spec("   ")
    assert info.value.code == "invalid_request"


def test_register_get_list_and_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, dict[str, object]]] = []

    def factory(model: str, **options: object) -> Adapter:
        made.append((model, options))
        return CanonicalAdapter(model, base_url="http://127.0.0.1:9")

    register_provider("unit-test-provider", factory)
    try:
        assert "unit-test-provider" in list_providers()
        assert get_provider("unit-test-provider") is factory
        adapter = connect("unit-test-provider:m1", max_tokens=5)
        assert isinstance(adapter, CanonicalAdapter) and made == [("m1", {"max_tokens": 5})]
        with pytest.raises(ValueError, match="already registered"):
            register_provider("unit-test-provider", factory)
        register_provider("unit-test-provider", factory, replace=True)
        monkeypatch.setenv("DISPATCH_NB_MODEL", "unit-test-provider:default-model")
        connect()
        assert made[-1][0] == "default-model"
    finally:
        from dispatch_nb import registry

        registry._providers.pop("unit-test-provider", None)
    with pytest.raises(RequestError, match="available providers") as info:
        get_provider("unit-test-provider")
    assert info.value.code == "unknown_provider"


def test_base_adapter_defaults() -> None:
    class Minimal(Adapter):
        pass

    a = Minimal()
    assert a.provider_name == "Minimal"
    assert a.max_context_tokens is None
    assert a.count_tokens("hi") == -1
    with pytest.raises(NotImplementedError):
        _ = a.model_name
    with pytest.raises(NotImplementedError):
        a.chat("hi")


def test_bad_arguments_are_clear() -> None:
    adapter = CanonicalAdapter("echo", base_url="http://127.0.0.1:9")
    with pytest.raises(TypeError, match=r"does not understand option.*bogus"):
        adapter.chat("hi", bogus=1)
    with pytest.raises(ValueError, match="temperature"):
        adapter.chat("hi", temperature=7)
    with pytest.raises(RequestError, match="nothing to send") as info:
        adapter.chat([])
    assert info.value.code == "invalid_request"
    with pytest.raises(TypeError, match="a tool must be"):
        adapter.chat("hi", tools=[42])
