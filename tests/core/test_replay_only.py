"""connect_for_cache: in replay mode a provider that cannot be built here is stood in for by a
ReplayOnlyAdapter whose cache keys are the real adapter's."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from dispatch_nb import register_provider, registry
from dispatch_nb.adapter import Adapter
from dispatch_nb.cache import CachedAdapter, CacheMissError, ResponseCache, cache_key
from dispatch_nb.errors import ModelUnavailableError
from dispatch_nb.providers.local import LocalAdapter, llama_cpp_installed
from dispatch_nb.replay_only import ReplayOnlyAdapter, connect_for_cache

REPO = Path(__file__).resolve().parents[2]


def _key(adapter: Adapter, prompt: str = "hi", **options: object) -> str:
    request = adapter._request(prompt, system="Be brief.", tools=None, stream=True,
                               max_tokens=None, temperature=0.5, options=dict(options))
    return cache_key(adapter.provider_name, adapter.model_name, request)


@pytest.fixture
def missing_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A provider name whose adapter cannot be built (its GGUF file does not exist); the
    registration is removed after the test."""
    monkeypatch.setitem(registry._providers, "gone", None)
    register_provider("gone", partial(LocalAdapter, model_path=tmp_path / "missing.gguf",
                                      chat_format="chatml"), replace=True)
    return "gone"


def test_stand_in_has_the_real_adapters_identity_and_keys(missing_model: str, tmp_path: Path) -> None:
    if not llama_cpp_installed():
        pytest.skip("needs llama-cpp-python to build the real adapter")
    stand_in = connect_for_cache(f"{missing_model}:lesson", "replay")
    assert isinstance(stand_in, ReplayOnlyAdapter)
    # The registry name of the class behind the partial, as LocalAdapter reports it.
    assert (stand_in.provider_name, stand_in.model_name) == ("local", "lesson")
    assert stand_in.default_max_tokens == 512
    gguf = tmp_path / "lesson.gguf"
    gguf.write_bytes(b"GGUF")  # constructing checks only that the file exists
    real = LocalAdapter("lesson", model_path=gguf)
    assert _key(stand_in) == _key(real)
    assert _key(stand_in, seed=7) == _key(real, seed=7)  # provider options are accepted alike
    with pytest.raises(TypeError):
        _key(stand_in, no_such_option=1)


def test_only_replay_gets_a_stand_in(missing_model: str) -> None:
    for mode in ("off", "read-write", "record"):
        with pytest.raises(ModelUnavailableError, match="no GGUF file") as info:
            connect_for_cache(f"{missing_model}:lesson", mode)
        assert info.value.code == "model_unavailable"


def test_stand_in_refuses_what_needs_the_model(missing_model: str, tmp_path: Path) -> None:
    stand_in = connect_for_cache(f"{missing_model}:lesson", "replay")
    assert not stand_in.validate()
    assert "replay only" in stand_in.display_name
    with pytest.raises(ModelUnavailableError, match="no GGUF file") as info:
        stand_in.chat("hello")
    assert info.value.code == "model_unavailable"
    with pytest.raises(ModelUnavailableError) as info:
        stand_in.list_models()
    assert info.value.code == "model_unavailable"
    cached = CachedAdapter(stand_in, ResponseCache(tmp_path / "c.jsonl", mode="replay"))
    with pytest.raises(CacheMissError) as info:  # a miss says so before anything would need the model
        cached.chat("hello")
    assert info.value.code == "cache_miss"


def test_stand_in_for_a_provider_that_cannot_be_imported_accepts_its_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider registered by descriptor whose module is not importable here (and which names
    no default max_tokens): the stand-in accepts the options its descriptor declares."""
    monkeypatch.setitem(registry._providers, "plugged", None)
    register_provider(registry.ProviderDescriptor(
        "plugged", "dispatch_nb_no_such_plugin_module:Adapter", default_model="plug-1",
        provider_options=frozenset({"reasoning_effort"})), replace=True)
    stand_in = connect_for_cache("plugged:plug-1", "replay")
    assert isinstance(stand_in, ReplayOnlyAdapter)
    assert stand_in.provider_options == frozenset({"reasoning_effort"})
    _key(stand_in, reasoning_effort="low")  # accepted, as it was before the refactor
    with pytest.raises(TypeError):
        _key(stand_in, no_such_option=1)


def test_recorded_notebook_answer_replays_without_llama_cpp() -> None:
    """In a fresh interpreter where llama_cpp cannot be imported, the quickstart's recorded
    answer replays through CachedAdapter + connect_for_cache."""
    cache = REPO / "notebooks" / "quickstart.dispatch-cache.jsonl"
    recorded = json.loads(cache.read_text(encoding="utf-8").splitlines()[0])
    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"
        "from dispatch_nb.cache import CachedAdapter, ResponseCache\n"
        "from dispatch_nb.replay_only import connect_for_cache\n"
        f"cache = ResponseCache({str(cache)!r}, mode='replay')\n"
        "model = CachedAdapter(connect_for_cache('local:smollm2', cache.mode), cache)\n"
        "print(type(model.inner).__name__)\n"
        "print(model.chat('What is a Python list? Answer in one sentence.', max_tokens=80).text)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=REPO).stdout
    kind, _, text = out.partition("\n")
    assert kind == "ReplayOnlyAdapter"
    assert text.strip() == recorded["response"]["content"][0]["text"].strip()


def test_a_vendors_bare_name_replays_as_that_vendors_without_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay sends nothing: ``gpt-4.1`` with no OpenAI key, the embedded model the default,
    is ``openai:gpt-4.1`` (the key it was recorded under), while a mode that may send refuses
    it naming OpenAI."""
    from dispatch_nb.registry import ProviderNotSetUpError

    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DISPATCH_NB_GITHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISPATCH_NB_MODEL", "local:smollm2")
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    adapter = connect_for_cache("gpt-4.1", "replay")
    try:
        assert (adapter.provider_name, adapter.model_name) == ("openai", "gpt-4.1")
    finally:
        adapter.close()
    # a batch replaying under that name reaches the file (a miss here: nothing is recorded)
    from dispatch_nb import batch

    result = batch("Say {x}", [{"x": 1}], model="gpt-4.1",
                   cache=ResponseCache(tmp_path / "none.jsonl", "replay"), progress=False)
    assert result.model == "openai:gpt-4.1"
    assert isinstance(result[0], CacheMissError) and result[0].code == "cache_miss"
    with pytest.raises(ProviderNotSetUpError) as info:
        connect_for_cache("gpt-4.1", "read-write")
    assert info.value.code == "authentication_failed" and info.value.provider == "openai"


def test_a_bare_name_replays_as_the_provider_that_recorded_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded through GitHub Copilot, replayed with no login: ``cached_model("gpt-4.1")`` and
    ``batch(model="gpt-4.1")`` find Copilot's answers (not a miss under ``openai:gpt-4.1``)."""
    from dispatch_nb import batch
    from dispatch_nb.cache import cached_model
    from tests.fakes.copilot import CopilotFake
    from tests.fakes.provider import Turn

    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DISPATCH_NB_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISPATCH_NB_HOME", str(tmp_path / "dnb"))
    path = tmp_path / "lesson.dispatch-cache.jsonl"
    with CopilotFake() as copilot:
        copilot.push(Turn(text="one answer"), Turn(text="a row's answer"))
        github = {"github_token": copilot.github.github_token,
                  "github_url": copilot.github.github_url, "github_api_url": copilot.github.api_url}
        recording = cached_model("copilot:gpt-4.1", ResponseCache(path, "record"), **github)
        recording.chat("Hi")
        result = batch("Say {x}", [{"x": 1}], model=recording.inner,
                       cache=ResponseCache(path, "record"), progress=False)
        assert result.ok and len(copilot.chat_requests) == 2
        recording.close()
    model = cached_model("gpt-4.1", ResponseCache(path, "replay"))
    try:
        assert (model.provider_name, model.model_name) == ("copilot", "gpt-4.1")
        assert model.chat("Hi").text == "one answer"
    finally:
        model.close()
    replayed = batch("Say {x}", [{"x": 1}], model="gpt-4.1", cache=ResponseCache(path, "replay"),
                     progress=False)
    assert replayed.model == "copilot:gpt-4.1" and replayed[0].text == "a row's answer"


def test_a_malformed_base_url_variable_does_not_stop_a_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay never uses the URL: a base URL variable without http(s):// gives the stand-in
    there, and the clear error in a mode that may send."""
    monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", "localhost:8080/v1")
    adapter = connect_for_cache("compatible:llama3:8b", "replay")
    assert isinstance(adapter, ReplayOnlyAdapter)
    assert (adapter.provider_name, adapter.model_name) == ("compatible", "llama3:8b")
    with pytest.raises(ValueError, match="base_url must start with http:// or https://"):
        connect_for_cache("compatible:llama3:8b", "read-write")


def test_a_bad_option_value_is_the_users_error_even_in_a_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a base URL the replay does not use is stood in for: another ValueError of the
    provider's constructor (here a backend that contradicts the provider) is raised."""
    monkeypatch.setenv("DISPATCH_NB_COMPATIBLE_BASE_URL", "localhost:8080/v1")
    with pytest.raises(ValueError, match="contradicts the provider"):
        connect_for_cache("compatible:llama3:8b", "replay", backend="official")


def test_the_fake_provider_without_its_url_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fake`` with neither base_url= nor DISPATCH_NB_FAKE_URL (a lesson recorded against a
    fake server, replayed where none runs) gets the stand-in in a replay; a mode that may send
    gets the error, a RequestError as before."""
    from dispatch_nb.errors import RequestError

    monkeypatch.delenv("DISPATCH_NB_FAKE_URL", raising=False)
    adapter = connect_for_cache("fake:echo", "replay")
    assert isinstance(adapter, ReplayOnlyAdapter)
    assert (adapter.provider_name, adapter.model_name) == ("fake", "echo")
    with pytest.raises(RequestError, match="DISPATCH_NB_FAKE_URL") as error:
        connect_for_cache("fake:echo", "off")
    assert error.value.code == "invalid_request"


def test_a_miss_says_why_the_model_cannot_answer_here(missing_model: str, tmp_path: Path) -> None:
    """CacheMissError.unavailable: the stand-in's reason (asking the model is no fix here), None
    when the model could answer."""
    cache = ResponseCache(tmp_path / "lesson.jsonl", mode="replay")
    cache.path.write_text("")
    stand_in = CachedAdapter(connect_for_cache(f"{missing_model}:m", "replay"), cache)
    with pytest.raises(CacheMissError) as missed:
        stand_in.chat("never recorded")
    assert missed.value.code == "cache_miss"
    assert missed.value.unavailable is not None and "missing.gguf" in missed.value.unavailable
    from dispatch_nb.testing import FakeAdapter

    with pytest.raises(CacheMissError) as missed:
        CachedAdapter(FakeAdapter(), cache).chat("never recorded")
    assert missed.value.code == "cache_miss" and missed.value.unavailable is None
