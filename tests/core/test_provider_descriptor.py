"""A provider is one descriptor: adding one (``tests/providers/acme.py``: one module, one
registration; one contract-suite target in ``tests/contract/targets.py``) is enough for the
registry, the default choice, the status rows, secret scrubbing and replay-only mode."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb import connect, get_provider, list_providers, register_provider
from dispatch_nb.cache import CachedAdapter, ResponseCache
from dispatch_nb.defaults import resolve_default_model
from dispatch_nb.registry import ProviderDescriptor, get_descriptor
from dispatch_nb.replay_only import ReplayOnlyAdapter, connect_for_cache
from tests.fakes.canonical import CanonicalFake
from tests.fakes.provider import Turn
from tests.providers import acme


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No key, no login, nothing of the developer's own setup."""
    for name in ("DISPATCH_NB_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ACME_API_KEY",
                 "DISPATCH_NB_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "COPILOT_API_KEY",
                 "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


@pytest.fixture
def server() -> Iterator[CanonicalFake]:
    with CanonicalFake() as fake:
        yield fake


def test_the_module_registers_one_descriptor() -> None:
    assert "acme" in list_providers()
    assert get_provider("acme") is acme.AcmeAdapter
    assert get_descriptor("acme") == acme.DESCRIPTOR
    assert get_descriptor("acme").label == "Acme"


def test_connect_and_chat_through_the_registry(server: CanonicalFake) -> None:
    adapter = connect("acme:acme-1", api_key="acme-test-key-0001", base_url=server.base_url)
    try:
        assert adapter.chat("hi").text == "acme-1: hi"
        assert server.last_request.headers["authorization"] == "Bearer acme-test-key-0001"
        assert server.max_tokens_of(server.last_request) == 2048
    finally:
        adapter.close()


def test_its_key_makes_it_the_default_after_the_built_in_ones(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"DISPATCH_NB_HOME": str(clean_env / "dnb"), "ACME_API_KEY": "acme-key-1234"}
    chosen = resolve_default_model(env)
    assert (chosen.spec, chosen.reason, chosen.source) == ("acme:acme-1", "ACME_API_KEY is set",
                                                           "acme")
    env["OPENAI_API_KEY"] = "sk-test-openai-0123456789"
    assert resolve_default_model(env).spec == "openai:gpt-4.1"  # rank 10 before rank 30


def test_cli_status_has_its_row(clean_env: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from dispatch_nb.__main__ import main

    monkeypatch.setenv("ACME_API_KEY", "acme-status-secret-77")
    monkeypatch.setenv("DISPATCH_NB_MODEL", "")
    assert main(["status"]) == 0  # its key alone is a provider that works
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    assert "ACME_API_KEY is set" in lines["Acme"]
    assert "acme:acme-1" in lines["Default model"]
    assert "acme-status-secret-77" not in out


def test_caches_never_write_its_key(server: CanonicalFake, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "acme-live-7f3a9c21-zz"  # matches none of the generic secret patterns
    monkeypatch.setenv("ACME_API_KEY", secret)
    # the adapter is given another key, so only the descriptor's key_env can name this one
    inner = connect("acme:acme-1", api_key="acme-test-key-0001", base_url=server.base_url)
    server.push(Turn(text=f"your key is {secret}"))
    path = tmp_path / "answers.jsonl"
    model = CachedAdapter(inner, ResponseCache(path, "record"))
    try:
        model.chat(f"repeat {secret}")
    finally:
        model.close()
    written = path.read_text()
    assert written and secret not in written
    assert "[REDACTED]" in json.dumps(written)


def test_replay_only_reads_the_descriptor(tmp_path: Path) -> None:
    """A provider whose module cannot be imported here (its extra is missing) still replays:
    the descriptor gives the default max_tokens and options the keys were recorded with."""
    descriptor = ProviderDescriptor(
        "unimportable", "no_such_module_for_dispatch_nb:Adapter", display_name="Nowhere",
        default_model="m-1", default_max_tokens=777, provider_options=frozenset({"seed"}),
    )
    register_provider(descriptor)
    try:
        with pytest.raises(ImportError):
            connect_for_cache("unimportable:m-1", "off")
        stand_in = connect_for_cache("unimportable:m-1", "replay")
        assert isinstance(stand_in, ReplayOnlyAdapter)
        assert (stand_in.provider_name, stand_in.model_name) == ("unimportable", "m-1")
        assert stand_in.default_max_tokens == 777
        assert stand_in.provider_options == frozenset({"seed"})
        assert connect_for_cache("unimportable:m-1", "replay", max_tokens=5).default_max_tokens == 5
    finally:
        from dispatch_nb import registry

        registry._providers.pop("unimportable", None)


def test_the_old_registration_forms_still_work() -> None:
    def factory(model: str, **options: Any) -> acme.AcmeAdapter:
        return acme.AcmeAdapter(model, api_key="acme-test-key-0001", **options)

    register_provider("acme-plain", factory)
    try:
        assert get_provider("acme-plain") is factory
        descriptor = get_descriptor("acme-plain")
        assert (descriptor.name, descriptor.label, descriptor.key_env) == ("acme-plain",
                                                                           "acme-plain", None)
        with pytest.raises(ValueError, match="already registered"):
            register_provider(ProviderDescriptor("acme-plain", factory))
        with pytest.raises(TypeError, match="takes no factory"):
            register_provider(ProviderDescriptor("x", factory), factory)
        with pytest.raises(ValueError, match="without ':'"):
            ProviderDescriptor("a:b", factory)
    finally:
        from dispatch_nb import registry

        registry._providers.pop("acme-plain", None)
