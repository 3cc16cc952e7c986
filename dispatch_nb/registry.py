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

import dataclasses
import importlib
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .adapter import Adapter
from .errors import RequestError
from .validation import describe

__all__ = [
    "DEFAULT_MODEL",
    "ProviderDescriptor",
    "ProviderFactory",
    "connect",
    "default_model_spec",
    "get_descriptor",
    "get_provider",
    "list_descriptors",
    "list_providers",
    "parse_model_spec",
    "register_provider",
]

DEFAULT_MODEL = "copilot:gpt-4.1"

ProviderFactory = Callable[..., Adapter]


@dataclass(frozen=True)
class ProviderDescriptor:
    """Everything dispatch_nb knows about a provider, in one place.

    The registry, ``%chat status`` / ``python -m dispatch_nb status``, the notebook's error advice,
    ``%chat key`` / ``%chat models``, secret scrubbing in caches, the choice of a default model
    and replay-only mode all read it, so adding a provider is one module that registers one
    descriptor (see ``docs/providers.md``)::

        register_provider(ProviderDescriptor(
            "acme", "acme_dispatch:AcmeAdapter", display_name="Acme", key_env="ACME_API_KEY",
            default_model="acme-1", default_max_tokens=2048))
    """

    #: the registry name: the ``provider`` of ``provider:model``
    name: str
    #: ``factory(model, **options) -> Adapter``, or ``"module:attribute"`` imported on first use
    factory: ProviderFactory | str
    #: how people call it (``%chat status`` rows); default: ``name``
    display_name: str = ""
    #: the environment variable holding its API key (``None``: it does not use one); shown by
    #: status, read by ``%chat key NAME``, scrubbed from caches, and (with ``default_rank``) makes
    #: it the default model when set
    key_env: str | None = None
    #: a model to name in examples, and the default model when chosen by default
    default_model: str | None = None
    #: the adapter's ``max_tokens`` when none is given (replay-only mode computes cache keys with it)
    default_max_tokens: int | None = None
    #: what to tell a user whose credentials were refused; default: derived from ``key_env``
    login_hint: str = ""
    #: a model to build the adapter with only to list models (the listing does not depend on
    #: it); default: ``default_model``
    listing_model: str | None = None
    #: other environment variables holding secrets to scrub from caches
    secret_env: tuple[str, ...] = ()
    #: the options its adapter accepts beyond the common ones (``None``: the factory's
    #: ``provider_options`` attribute)
    provider_options: frozenset[str] | None = None
    #: chosen as the default model when ``key_env`` is set, lowest rank first (``None``: never)
    default_rank: int | None = None
    #: ``status`` shows a row for its ``key_env`` (one row per variable)
    status_row: bool = True

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name or ":" in name or name != name.strip():
            raise ValueError(f"provider name {name!r} must be non-empty, without ':' or spaces")
        factory = self.factory
        if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
            raise TypeError("factory must be a callable or a 'module:attribute' string")

    @property
    def label(self) -> str:
        """The display name, else the registry name."""
        return self.display_name or self.name

    @property
    def example_model(self) -> str:
        return self.default_model or "MODEL"

    @property
    def model_for_listing(self) -> str:
        return self.listing_model or self.default_model or "default"

    @property
    def credentials_hint(self) -> str:
        """How to fix refused credentials."""
        if self.login_hint:
            return self.login_hint
        if self.key_env:
            return (
                f"Run `%chat key {self.name}` to type the key (nothing is saved in the notebook), "
                f"or set {self.key_env} in the environment Jupyter starts from (or in a .env "
                "file), or choose another model with -m."
            )
        return "Check the provider's credentials."

    @property
    def secret_env_names(self) -> tuple[str, ...]:
        return ((self.key_env,) if self.key_env else ()) + self.secret_env


_lock = threading.Lock()
_BUILTIN: tuple[ProviderDescriptor, ...] = (
    ProviderDescriptor(
        "copilot", "dispatch_nb.providers.copilot:CopilotAdapter", display_name="GitHub Copilot",
        default_model="gpt-4.1", default_max_tokens=8192,
        login_hint="Run `%chat login` to sign in to GitHub Copilot (or set "
                   "DISPATCH_NB_GITHUB_TOKEN).",
        secret_env=("DISPATCH_NB_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "COPILOT_API_KEY"),
    ),
    ProviderDescriptor(
        "openai", "dispatch_nb.providers.openai:connect_official", display_name="OpenAI",
        key_env="OPENAI_API_KEY", default_model="gpt-4.1", default_max_tokens=4096,
        default_rank=10,
    ),
    ProviderDescriptor(
        "compatible", "dispatch_nb.providers.openai:connect_compatible",
        display_name="OpenAI-compatible server", key_env="OPENAI_API_KEY",
        default_model="llama3", default_max_tokens=4096, listing_model="default",
        login_hint="Check the server's API key (`%chat key compatible`, or OPENAI_API_KEY in the "
                   "environment) and OPENAI_BASE_URL.",
    ),
    ProviderDescriptor(
        "anthropic", "dispatch_nb.providers.anthropic:AnthropicAdapter", display_name="Anthropic",
        key_env="ANTHROPIC_API_KEY", default_model="claude-sonnet-4-5", default_max_tokens=4096,
        default_rank=20,
    ),
    ProviderDescriptor(
        "local", "dispatch_nb.providers.local:LocalAdapter", display_name="Embedded model",
        default_model="smollm2", default_max_tokens=512,
    ),
    ProviderDescriptor(
        "fake", "dispatch_nb.providers.fake:CanonicalAdapter", display_name="Fake (canonical protocol)",
        default_model="echo", default_max_tokens=1024,
    ),
)
_providers: dict[str, ProviderDescriptor] = {d.name: d for d in _BUILTIN}
#: the names registered by dispatch_nb itself
BUILTIN_PROVIDERS = frozenset(_providers)


class UnknownProviderError(RequestError, LookupError):
    """No provider is registered under that name."""

    default_code = "unknown_provider"


def register_provider(
    name: str | ProviderDescriptor,
    factory: ProviderFactory | str | None = None,
    *,
    replace: bool = False,
) -> None:
    """Register ``factory(model, **options) -> Adapter`` under ``name``, or one
    :class:`ProviderDescriptor` (``register_provider(ProviderDescriptor(...))``).

    ``factory`` may also be a ``"module:attribute"`` string, imported on first use. Registering a
    name twice raises ``ValueError`` unless ``replace=True``.
    """
    if isinstance(name, ProviderDescriptor):
        if factory is not None:
            raise TypeError("register_provider(descriptor) takes no factory: it is in the descriptor")
        descriptor = name
    else:
        if factory is None:
            raise TypeError("register_provider(name, factory) needs a factory")
        descriptor = ProviderDescriptor(name, factory)
    with _lock:
        if _providers.get(descriptor.name) is not None and not replace:
            raise ValueError(
                f"a provider named {descriptor.name!r} is already registered; pass replace=True "
                "to replace it"
            )
        _providers[descriptor.name] = descriptor


def list_providers() -> list[str]:
    """Names of every registered provider."""
    with _lock:
        return sorted(_providers)


def list_descriptors() -> list[ProviderDescriptor]:
    """Every registered provider's descriptor, in registration order (built-ins first)."""
    with _lock:
        return [d for d in _providers.values() if d is not None]


def get_descriptor(name: str) -> ProviderDescriptor:
    """The descriptor registered under ``name`` (raises :class:`UnknownProviderError`)."""
    with _lock:
        descriptor = _providers.get(name)
    if descriptor is None:
        raise UnknownProviderError(
            f"unknown provider {name!r}; available providers: {', '.join(list_providers())}"
        )
    return descriptor


def find_descriptor(name: str | None) -> ProviderDescriptor | None:
    """The descriptor registered under ``name``, or ``None``."""
    if not name:
        return None
    with _lock:
        return _providers.get(name)


def key_env_rows() -> list[tuple[str, str]]:
    """``(display name, key variable)`` for the status rows of API keys: one row per variable,
    named by the first provider registered with it (OpenAI, not the compatible server)."""
    rows: dict[str, str] = {}
    for descriptor in list_descriptors():
        if descriptor.key_env and descriptor.status_row and descriptor.key_env not in rows:
            rows[descriptor.key_env] = descriptor.label
    return [(label, env) for env, label in rows.items()]


def get_provider(name: str) -> ProviderFactory:
    """The factory registered under ``name`` (imports a built-in provider on first use)."""
    descriptor = get_descriptor(name)
    entry = descriptor.factory
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        module = importlib.import_module(module_name)
        factory: ProviderFactory = getattr(module, attr)
        with _lock:
            if _providers.get(name) is descriptor:
                _providers[name] = dataclasses.replace(descriptor, factory=factory)
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
        if find_descriptor(head) is not None:
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
    descriptor = find_descriptor(name)
    if descriptor is not None:
        raise RequestError(
            f"{name!r} is a provider, not a model: write it as '{name}:MODEL' "
            f"(e.g. '{name}:{descriptor.example_model}')"
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
