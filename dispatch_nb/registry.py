"""Providers by name, and ``connect("provider:model")``.

::

    connect("openai:gpt-4.1")                     # provider:model
    connect("gpt-4.1")                            # the default provider (from DISPATCH_NB_MODEL)
    connect("compatible:llama", base_url="http://127.0.0.1:8080/v1")
    register_provider("mine", lambda model, **options: MyAdapter(model, **options))

Built-in providers are registered as import paths and imported on first use, so
``import dispatch_nb`` stays fast.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from .adapter import Adapter
from .errors import RequestError
from .validation import describe

__all__ = [
    "DEFAULT_MODEL",
    "ProviderFactory",
    "connect",
    "default_model_spec",
    "get_provider",
    "list_providers",
    "parse_model_spec",
    "register_provider",
]

DEFAULT_MODEL = "copilot:gpt-4.1"

ProviderFactory = Callable[..., Adapter]
_Entry = ProviderFactory | str

_lock = threading.Lock()
_providers: dict[str, _Entry] = {
    "copilot": "dispatch_nb.providers.copilot:CopilotAdapter",
    "openai": "dispatch_nb.providers.openai:connect_official",
    "compatible": "dispatch_nb.providers.openai:connect_compatible",
    "anthropic": "dispatch_nb.providers.anthropic:AnthropicAdapter",
    "local": "dispatch_nb.providers.local:LocalAdapter",
    "fake": "dispatch_nb.providers.fake:FakeAdapter",
}


#: a model to show in examples of ``provider:MODEL``
_EXAMPLE_MODEL = {
    "copilot": "gpt-4.1",
    "openai": "gpt-4.1",
    "compatible": "llama3",
    "anthropic": "claude-sonnet-4-5",
    "local": "smollm2",
    "fake": "echo",
}


class UnknownProviderError(RequestError, LookupError):
    """No provider is registered under that name."""

    default_code = "unknown_provider"


def register_provider(name: str, factory: ProviderFactory | str, *, replace: bool = False) -> None:
    """Register ``factory(model, **options) -> Adapter`` under ``name``.

    ``factory`` may also be a ``"module:attribute"`` string, imported on first use. Registering a
    name twice raises ``ValueError`` unless ``replace=True``.
    """
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"provider name {name!r} must be non-empty, without ':' or spaces")
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise TypeError("factory must be a callable or a 'module:attribute' string")
    with _lock:
        if name in _providers and not replace:
            raise ValueError(
                f"a provider named {name!r} is already registered; pass replace=True to replace it"
            )
        _providers[name] = factory


def list_providers() -> list[str]:
    """Names of every registered provider."""
    with _lock:
        return sorted(_providers)


def get_provider(name: str) -> ProviderFactory:
    """The factory registered under ``name`` (imports a built-in provider on first use)."""
    with _lock:
        entry = _providers.get(name)
    if entry is None:
        raise UnknownProviderError(
            f"unknown provider {name!r}; available providers: {', '.join(list_providers())}"
        )
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        module = importlib.import_module(module_name)
        factory: ProviderFactory = getattr(module, attr)
        with _lock:
            if _providers.get(name) == entry:
                _providers[name] = factory
        return factory
    return entry


def default_model_spec() -> str:
    """``DISPATCH_NB_MODEL``, else ``copilot:gpt-4.1``."""
    return os.environ.get("DISPATCH_NB_MODEL", "").strip() or DEFAULT_MODEL


def parse_model_spec(spec: str) -> tuple[str, str]:
    """``"provider:model"`` → ``(provider, model)``; a bare model gets the default provider.

    Model names may themselves contain ``:`` (``ollama``'s ``llama3:8b``): only a registered
    provider name before the first ``:`` counts as a provider.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise RequestError(
            "a model spec must be 'provider:model' or a model name, e.g. 'openai:gpt-4.1'; "
            f"providers: {', '.join(list_providers())}"
        )
    spec = spec.strip()
    head, sep, rest = spec.partition(":")
    if sep:
        with _lock:
            known = head in _providers
        if known:
            if not rest:
                raise RequestError(
                    f"model spec {spec!r} names provider {head!r} but no model; "
                    f"write it as '{head}:MODEL'"
                )
            return head, rest
        if head and head.isidentifier() and "/" not in rest and not rest[:1].isdigit():
            raise UnknownProviderError(
                f"unknown provider {head!r} in model spec {spec!r}; "
                f"available providers: {', '.join(list_providers())}"
            )
    default = default_model_spec()
    provider, dsep, _ = default.partition(":")
    if not dsep:
        raise RequestError(
            f"DISPATCH_NB_MODEL={default!r} must be 'provider:model' (e.g. 'copilot:gpt-4.1')"
        )
    if not sep:
        _check_bare_model(spec, provider)
    return provider, spec


def _check_bare_model(name: str, provider: str) -> None:
    """A bare name is a model of the default provider. Refuse the names that are surely not
    one: a provider's name (``connect("openai")``), and a plain word without a version or size
    (``"nope"``, ``"claude"``) — model names carry one (``gpt-4.1``, ``claude-sonnet-4-5``,
    ``llama3``, ``o3``). ``provider:NAME`` always passes the name through as it is."""
    with _lock:
        is_provider = name in _providers
    if is_provider:
        raise RequestError(
            f"{name!r} is a provider, not a model: write it as '{name}:MODEL' "
            f"(e.g. '{name}:{_EXAMPLE_MODEL.get(name, 'MODEL')}')"
        )
    if re.fullmatch(r"[A-Za-z]+", name):
        raise UnknownProviderError(
            f"{name!r} is neither 'provider:model' nor a model name (model names have a version, "
            f"e.g. 'gpt-4.1', 'claude-sonnet-4-5'); write it as 'provider:model', e.g. "
            f"'{provider}:{name}' if {provider} really has a model called {name!r}; "
            f"providers: {', '.join(list_providers())}"
        )


class _Default:
    """The value of an omitted ``spec`` (None is refused: it is usually a variable left unset)."""

    def __repr__(self) -> str:
        return "<the default model>"


_DEFAULT_SPEC: Any = _Default()


def connect(spec: str = _DEFAULT_SPEC, **options: Any) -> Adapter:
    """An adapter for ``spec`` (``"provider:model"`` or a model name of the default provider);
    without ``spec``, the default model (``DISPATCH_NB_MODEL``, else ``copilot:gpt-4.1``).
    ``options`` go to the provider's constructor.

    A spec that cannot be right fails here, before any request: ``None`` or a non-string
    (``TypeError``), an unknown provider, a provider's name alone (``connect("openai")``) or a
    word that is no model name (:class:`UnknownProviderError`, a ``RequestError``)."""
    if isinstance(spec, _Default):
        spec = default_model_spec()
    elif not isinstance(spec, str):
        raise TypeError(
            "connect() takes a model spec 'provider:model' (e.g. 'openai:gpt-4.1'), or nothing "
            f"for the default model ({default_model_spec()}) — not {describe(spec)}"
        )
    provider, model = parse_model_spec(spec)
    factory = get_provider(provider)
    return factory(model, **options)
