"""OpenAIAdapter configuration: explicit backend selection, base URLs, keys, registry entries."""

from __future__ import annotations

import logging

import pytest

from dispatch_nb import AuthenticationError, connect
from dispatch_nb.providers.openai import (
    DEFAULT_COMPATIBLE_URL,
    DEFAULT_OFFICIAL_URL,
    CompatibleAdapter,
    OpenAIAdapter,
    ResponsesAdapter,
    connect_compatible,
)
from dispatch_nb.wire.chat_completions import ChatCompletionsWire
from dispatch_nb.wire.responses import ResponsesWire

from ..fakes.openai_chat import OpenAIChatFake
from ..fakes.openai_responses import OpenAIResponsesFake


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_BACKEND",
                 "DISPATCH_NB_COMPATIBLE_API_KEY", "DISPATCH_NB_COMPATIBLE_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_default_backend_is_official() -> None:
    adapter = OpenAIAdapter("gpt-4.1")
    assert adapter.backend_mode == "official"
    assert adapter.base_url == DEFAULT_OFFICIAL_URL
    assert (adapter.provider_name, adapter.display_name) == ("openai", "OpenAI")


def test_openai_adapter_makes_the_adapter_of_its_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two adapters, each with its wire format fixed when made; OpenAIAdapter(...) keeps working
    and makes the right one."""
    official = OpenAIAdapter("gpt-4.1", api_key="sk-x", max_tokens=100)
    assert type(official) is ResponsesAdapter and isinstance(official, OpenAIAdapter)
    assert isinstance(official.wire, ResponsesWire) and official.default_max_tokens == 100
    compatible = OpenAIAdapter("llama3", backend="compatible", base_url="http://127.0.0.1:9/v1")
    assert type(compatible) is CompatibleAdapter and isinstance(compatible, OpenAIAdapter)
    assert isinstance(compatible.wire, ChatCompletionsWire)
    assert type(connect("compatible:llama3")) is CompatibleAdapter
    assert type(connect("openai:gpt-4.1")) is ResponsesAdapter
    assert type(ResponsesAdapter("gpt-4.1")) is ResponsesAdapter
    with pytest.raises(ValueError, match="contradicts"):
        CompatibleAdapter("llama3", backend="official")
    monkeypatch.setenv("OPENAI_BACKEND", "compatible")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8002/v1")
    chosen = OpenAIAdapter("llama3")  # OPENAI_* describe the compatible server OPENAI_BACKEND chose
    assert type(chosen) is CompatibleAdapter and chosen.base_url == "http://127.0.0.1:8002/v1"
    assert chosen.settings.key_env == "OPENAI_API_KEY"


def test_backend_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BACKEND", "compatible")
    adapter = OpenAIAdapter("llama3")
    assert adapter.backend_mode == "compatible"
    assert adapter.base_url == DEFAULT_COMPATIBLE_URL
    assert adapter.display_name == "OpenAI-compatible server"
    assert OpenAIAdapter("gpt-4.1", backend="official").backend_mode == "official"


@pytest.mark.parametrize("where", ["argument", "environment"])
def test_unknown_backend_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    if where == "environment":
        monkeypatch.setenv("OPENAI_BACKEND", "azure")
        make = lambda: OpenAIAdapter("gpt-4.1")  # noqa: E731
    else:
        make = lambda: OpenAIAdapter("gpt-4.1", backend="chat")  # noqa: E731
    with pytest.raises(ValueError, match=r"official.*compatible") as info:
        make()
    assert ("OPENAI_BACKEND" in str(info.value)) == (where == "environment")


def test_base_url_never_switches_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    local = OpenAIAdapter("llama3", base_url="http://127.0.0.1:11434/v1")
    assert local.backend_mode == "official"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    from_env = OpenAIAdapter("llama3")
    assert (from_env.backend_mode, from_env.base_url) == ("official", "http://127.0.0.1:8000/v1")
    # compatible: has its own variable (OPENAI_BASE_URL is OpenAI's)
    compatible = OpenAIAdapter("llama3", backend="compatible")
    assert (compatible.backend_mode, compatible.base_url) == ("compatible", DEFAULT_COMPATIBLE_URL)
    monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", "http://127.0.0.1:8001/v1")
    assert connect("compatible:llama3").base_url == "http://127.0.0.1:8001/v1"
    assert OpenAIAdapter("llama3").base_url == "http://127.0.0.1:8000/v1"


def test_registry_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    official = connect("openai:gpt-4.1")
    assert isinstance(official, OpenAIAdapter) and official.backend_mode == "official"
    assert official.model_name == "gpt-4.1"
    local = connect("compatible:llama3:8b", base_url="http://127.0.0.1:11434/v1")
    assert isinstance(local, OpenAIAdapter) and local.backend_mode == "compatible"
    assert (local.model_name, local.base_url) == ("llama3:8b", "http://127.0.0.1:11434/v1")
    assert connect_compatible("m").base_url == DEFAULT_COMPATIBLE_URL
    assert connect("openai:m", backend="compatible").backend_mode == "compatible"
    with pytest.raises(ValueError, match="contradicts"):
        connect_compatible("m", backend="official")
    monkeypatch.setenv("OPENAI_BACKEND", "compatible")
    assert connect("openai:llama3").backend_mode == "compatible"


def test_compatible_needs_no_key_official_does() -> None:
    with OpenAIChatFake() as chat:
        answer = OpenAIAdapter("m", backend="compatible", base_url=chat.base_url).chat("hi")
        assert answer.text == "echo: hi"
        assert chat.last_request.header("authorization") is None
    with OpenAIResponsesFake() as responses:
        adapter = OpenAIAdapter("gpt-5", base_url=responses.base_url)
        with pytest.raises(AuthenticationError, match="OPENAI_API_KEY") as info:
            adapter.chat("hi")
        assert info.value.code == "authentication_failed"
        with pytest.raises(AuthenticationError) as info:
            adapter.list_models()
        assert info.value.code == "authentication_failed"
        assert responses.requests == []


def test_key_from_environment_and_never_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-SECRET")
    with OpenAIResponsesFake(api_key="sk-env-SECRET") as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)  # the key's server
        adapter = OpenAIAdapter("gpt-5")
        assert adapter.chat("hi").text == "echo: hi"
        assert "SECRET" not in repr(adapter)
        assert "backend='official'" in repr(adapter)
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    late = OpenAIAdapter("gpt-5")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-late")  # set after the adapter was made: still used
    assert late.auth_headers() == {"authorization": "Bearer sk-late"}


def test_environment_key_never_goes_to_an_explicit_compatible_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-SECRET")
    with OpenAIChatFake() as third_party:
        OpenAIAdapter("m", backend="compatible", base_url=third_party.base_url).chat("hi")
        assert third_party.last_request.header("authorization") is None
        OpenAIAdapter("m", backend="compatible", base_url=third_party.base_url,
                      api_key="local-key").chat("hi")
        assert third_party.last_request.header("authorization") == "Bearer local-key"
        # OpenAI's key never goes to the compatible server, even where the environment points it
        monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", third_party.base_url)
        OpenAIAdapter("m", backend="compatible").chat("hi")
        connect("compatible:m").chat("hi")
        assert [r.header("authorization") for r in third_party.requests[-2:]] == [None, None]
        # its own key, paired with its own base URL in the environment, goes along
        monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_API_KEY", "local-env-key")
        connect("compatible:m").chat("hi")
        assert third_party.last_request.header("authorization") == "Bearer local-env-key"
        # ... but not to a server named only by base_url=
        with OpenAIChatFake() as other:
            connect("compatible:m", base_url=other.base_url).chat("hi")
            assert other.last_request.header("authorization") is None


def test_an_environment_key_is_never_sent_to_another_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OPENAI_API_KEY is for OPENAI_BASE_URL's server (else api.openai.com): an adapter pointed
    elsewhere with base_url= sends no key and fails naming the model and the URL; the key's own
    server gets it."""
    secret = "sk-real-openai-SECRET-0001"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    with OpenAIResponsesFake(api_key=secret) as home, OpenAIResponsesFake() as foreign:
        monkeypatch.setenv("OPENAI_BASE_URL", home.base_url)
        adapter = connect("openai:gpt-4.1-mini", base_url=foreign.base_url, max_retries=0)
        with pytest.raises(AuthenticationError) as info:
            adapter.chat("hi")
        message = info.value.message
        assert info.value.code == "authentication_failed"
        assert "openai:gpt-4.1-mini" in message and foreign.base_url in message
        assert f"the server OPENAI_BASE_URL names ({home.base_url})" in message
        assert secret not in message and secret not in repr(info.value)
        assert foreign.requests == []
        assert connect("openai:gpt-4.1-mini").chat("hi").text == "echo: hi"
        assert home.last_request.header("authorization") == f"Bearer {secret}"
        # the same server under another path is still its server
        same = OpenAIAdapter("gpt-4.1", base_url=home.base_url.rstrip("/") + "/proxy/v1")
        assert same.auth_headers() == {"authorization": f"Bearer {secret}"}
        # saying it for that host: api_key= together with base_url=
        paired = connect("openai:gpt-4.1-mini", base_url=foreign.base_url, api_key="sk-for-it")
        paired.chat("hi")
        assert foreign.last_request.header("authorization") == "Bearer sk-for-it"
    monkeypatch.delenv("OPENAI_BASE_URL")
    with OpenAIChatFake() as local:  # OpenAI's key never goes to a local server either
        with pytest.raises(AuthenticationError, match=r"api\.openai\.com") as info:
            OpenAIAdapter("m", base_url=local.base_url, max_retries=0).chat("hi")
        assert info.value.code == "authentication_failed"
        assert local.requests == []


def test_a_refused_key_names_the_model_and_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIChatFake(api_key="the-servers-key") as server:
        monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-this-server-0000")
        with pytest.raises(AuthenticationError) as info:
            connect("compatible:llama3", max_retries=0).chat("hi")
        assert info.value.code == "authentication_failed"
        assert "compatible:llama3" in info.value.message and server.base_url in info.value.message
        assert server.last_request.header("authorization") is None


def test_extra_headers_and_request_log(caplog: pytest.LogCaptureFixture) -> None:
    with OpenAIChatFake() as fake:
        adapter = OpenAIAdapter("m", backend="compatible", base_url=fake.base_url,
                                headers={"x-team": "nb"}, api_key="k")
        with caplog.at_level(logging.INFO, logger="dispatch_nb"):
            adapter.chat("hi", extra_headers={"x-trace": "1"}, extra_body={"seed": 7})
        request = fake.last_request
        assert (request.header("x-team"), request.header("x-trace")) == ("nb", "1")
        assert request.json["seed"] == 7
    line = next(r.getMessage() for r in caplog.records if "request provider=" in r.getMessage())
    assert "provider=compatible" in line and "backend=compatible" in line


def test_invalid_model_name() -> None:
    with pytest.raises(ValueError):
        OpenAIAdapter("")
