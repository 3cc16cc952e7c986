"""A provider is one descriptor: adding one (``tests/providers/acme.py``: one module, one
registration; one contract-suite target in ``tests/contract/targets.py``) is enough for the
registry, the default choice, the status rows, secret scrubbing and replay-only mode."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_nb import ModelInfo, batch, connect, get_provider, list_providers, register_provider
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


# -- what a provider declares instead of being named in the code --------------------------------------
class PremiumAcme(acme.AcmeAdapter):
    """An Acme whose models cost premium requests, as Copilot's do."""

    @property
    def provider_name(self) -> str:
        return "acme-premium"

    async def alist_models(self) -> list[ModelInfo]:
        return [ModelInfo(id=self.model_name, premium_multiplier=1.5)]


def test_premium_requests_are_counted_for_a_provider_that_declares_them(
    server: CanonicalFake,
) -> None:
    register_provider(ProviderDescriptor("acme-premium", PremiumAcme, premium_multiplier=True))
    try:
        model = connect("acme-premium:acme-1", api_key="acme-test-key-0001",
                        base_url=server.base_url)
        result = batch("{row}", ["a", "b"], model=model, progress=False)
        assert result.ok == 2 and result.premium_requests == 3.0
        plain = connect("acme:acme-1", api_key="acme-test-key-0001", base_url=server.base_url)
        assert batch("{row}", ["a"], model=plain, progress=False).premium_requests is None
    finally:
        from dispatch_nb import registry

        registry._providers.pop("acme-premium", None)


def test_a_provider_with_a_login_declares_it(clean_env: Path) -> None:
    """A second login-based provider is one descriptor: it is the default when its login is
    found, the notebook makes sure of its login before a call, and status has its row."""
    from types import SimpleNamespace

    from dispatch_nb.notebook.state import KernelState

    found: dict[str, str] = {}
    descriptor = ProviderDescriptor(
        "acme-login", acme.AcmeAdapter, display_name="Acme Login", default_model="acme-2",
        login_flow="github-device", find_login=lambda env: found.get("where"), default_rank=5,
    )
    register_provider(descriptor)
    try:
        env = {"DISPATCH_NB_HOME": str(clean_env / "dnb"), "OPENAI_API_KEY": "sk-test-0000"}
        assert resolve_default_model(env).spec == "openai:gpt-4.1"
        found["where"] = "acme's token file"
        chosen = resolve_default_model(env)
        assert (chosen.spec, chosen.source) == ("acme-login:acme-2", "acme-login")
        assert chosen.reason == "logged in to Acme Login (acme's token file)"
        state = KernelState(None, SimpleNamespace(login_on_demand=True))
        assert state.needs_login("acme-login", "off") and not state.needs_login("acme", "off")
        assert not state.needs_login("acme-login", "replay")
    finally:
        from dispatch_nb import registry

        registry._providers.pop("acme-login", None)


def test_a_plug_in_whose_check_fails_leaves_the_default_choice_working(
    clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plug-in's ``available`` or ``find_login`` that raises is named in the reason and skipped:
    it does not break the default choice (``%chat status``, every cell without ``-m``) nor
    ``python -m dispatch_nb status``."""
    from dispatch_nb.__main__ import main

    def broken(*_: object) -> bool:
        raise OSError("cannot stat /opt/acme/model.bin")

    register_provider(ProviderDescriptor("acme-avail", acme.AcmeAdapter, display_name="Avail",
                                         available=broken, default_rank=5))
    register_provider(ProviderDescriptor("acme-find", acme.AcmeAdapter, find_login=broken,
                                         login_flow="github-device", default_rank=6))
    register_provider(ProviderDescriptor("acme-off", acme.AcmeAdapter, available=lambda: False))
    try:
        env = {"DISPATCH_NB_HOME": str(clean_env / "dnb")}
        assert resolve_default_model({**env, "ACME_API_KEY": "acme-key-1234"}).spec == "acme:acme-1"
        reason = resolve_default_model(env).reason
        assert "Avail cannot be checked (OSError: cannot stat /opt/acme/model.bin)" in reason
        assert "acme-find cannot be checked (OSError" in reason
        main(["status"])
        out = capsys.readouterr().out
        assert "Avail:          ⚠ cannot be checked (OSError: cannot stat" in out
        assert "acme-off:       not available here\n" in out  # not the embedded model's extra
    finally:
        from dispatch_nb import registry

        registry._providers.pop("acme-avail", None)
        registry._providers.pop("acme-find", None)
        registry._providers.pop("acme-off", None)


@pytest.mark.parametrize("field", ["secret_env", "model_names", "serves"])
def test_a_descriptor_with_a_string_for_a_tuple_is_refused(field: str) -> None:
    """``model_names="acme-*"`` would be the patterns ``a``, ``c``, ..., ``*``: every bare model
    name anyone writes would go to that provider."""
    with pytest.raises(TypeError, match=rf"{field} must be a tuple of strings, e.g. {field}=\('acme-\*',\)"):
        ProviderDescriptor("acme-typo", acme.AcmeAdapter, **{field: "acme-*"})
    with pytest.raises(TypeError, match=r"default_rank must be an int or None, not '30' \(a str\)"):
        ProviderDescriptor("acme-typo", acme.AcmeAdapter, default_rank="30")  # type: ignore[arg-type]


#: where a provider's name may be spelled: the providers, their logins and wire formats, the registry
NAMED_PLACES = ("providers", "auth", "wire")


def _strings_naming_a_provider(path: Path, names: set[str]) -> list[str]:
    """String constants (docstrings aside) that are a provider's name or a ``provider:model``
    spec of one: code that decides by a provider's name. A name inside prose (an error
    message's example, "sign in to GitHub Copilot") is not a decision and is allowed."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in docstrings:
            continue
        value = node.value.strip().lower()
        head, sep, rest = value.partition(":")
        if value in names or (sep and head in names and rest and " " not in value):
            found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def test_no_provider_is_named_outside_the_providers_and_the_registry() -> None:
    """A provider's needs (a login, premium requests, its default) are in its descriptor:
    no other module spells a built-in provider's name."""
    import dispatch_nb
    from dispatch_nb.registry import BUILTIN_PROVIDERS

    root = Path(dispatch_nb.__file__).parent
    offending = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in NAMED_PLACES or relative.as_posix() == "registry.py":
            continue
        offending += _strings_naming_a_provider(path, set(BUILTIN_PROVIDERS))
    assert offending == []
    # the scan sees what it must see
    assert _strings_naming_a_provider(root / "registry.py", {"copilot"})
