"""Providers by name (:class:`ProviderDescriptor`, :func:`register_provider`, the entry-point group
:data:`ENTRY_POINT_GROUP`) and ``connect("provider:model")``: docs/providers.md. Built-in providers
are import paths, imported on first use, so ``import dispatch_nb`` stays fast.
"""

from __future__ import annotations

import fnmatch
import importlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .adapter import Adapter
from .cost import FREE_PROVIDERS, PRICE_PROVIDERS
from .errors import AuthenticationError, RequestError
from .validation import describe

__all__ = [
    "DEFAULT_MODEL",
    "ENTRY_POINT_GROUP",
    "ProviderDescriptor",
    "ProviderFactory",
    "ProviderNotSetUpError",
    "connect",
    "default_model_spec",
    "get_descriptor",
    "get_provider",
    "list_descriptors",
    "list_providers",
    "owner_of",
    "parse_model_spec",
    "qualify_model_spec",
    "register_provider",
]

DEFAULT_MODEL = "copilot:gpt-4.1"
#: the entry-point group installed distributions register providers in
ENTRY_POINT_GROUP = "dispatch_nb.providers"

logger = logging.getLogger("dispatch_nb")

ProviderFactory = Callable[..., Adapter]
#: ``find_login(env) -> where the saved login is`` (a description, never the secret), or None
LoginFinder = Callable[[Mapping[str, str]], "str | None"]


@dataclass(frozen=True)
class ProviderDescriptor:
    """Everything dispatch_nb knows about a provider, in one place: who reads each field, and
    why adding a provider is one module that registers one descriptor, is in docs/providers.md::

        register_provider(ProviderDescriptor(
            "acme", "acme_dispatch:AcmeAdapter", display_name="Acme", key_env="ACME_API_KEY",
            default_model="acme-1", default_max_tokens=2048))
    """

    #: the ``provider`` of ``provider:model``
    name: str
    #: ``factory(model, **options) -> Adapter``, or ``"module:attribute"`` imported on first use
    factory: ProviderFactory | str
    display_name: str = ""
    #: the environment variable holding its API key (``None``: it uses none)
    key_env: str | None = None
    default_model: str | None = None
    default_max_tokens: int | None = None
    #: what to tell a user whose credentials were refused (default: from ``key_env``)
    login_hint: str = ""
    listing_model: str | None = None
    #: more environment variables holding secrets, scrubbed from caches
    secret_env: tuple[str, ...] = ()
    #: options its adapter accepts beyond the common ones (``None``: the factory's attribute)
    provider_options: frozenset[str] | None = None
    #: its place among the default models, lowest first (``None``: never the default)
    default_rank: int | None = None
    status_row: bool = True
    #: the environment variable naming its server; ``key_env``'s key is sent only there
    base_url_env: str | None = None
    #: its interactive login (``"github-device"``: GitHub's device flow), ``None``: none
    login_flow: str | None = None
    #: ``find_login(env) -> str | None``: where its saved login is, never the secret
    find_login: LoginFinder | str | None = None
    #: ``available() -> bool``: whether a provider needing no key nor login can run here
    available: Callable[[], bool] | str | None = None
    #: each call counts as the model's ``ModelInfo.premium_multiplier`` premium requests
    premium_multiplier: bool = False
    #: one line for the user when it is the default only because nothing else is set up
    default_note: str = ""
    #: the ``genai-prices`` provider id (``None``: prices unknown, never zero; docs/cost.md)
    price_provider: str | None = None
    #: its answers cost nothing, as a model running on this machine: priced at $0, not unknown
    free: bool = False
    #: the bare model names that are its own (its vendor's), as case-insensitive ``fnmatch``
    #: patterns (``"gpt-*"``): such a name goes to it, not to the default provider, unless the
    #: default serves it (:attr:`serves`)
    model_names: tuple[str, ...] = ()
    #: the providers whose own model names it serves too (``"*"``: any name it is given;
    #: ``None``, a provider that does not say, e.g. one registered with a factory: any name)
    serves: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name or ":" in name or name != name.strip():
            raise ValueError(f"provider name {name!r} must be non-empty, without ':' or spaces")
        factory = self.factory
        if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
            raise TypeError("factory must be a callable or a 'module:attribute' string")
        for field in ("secret_env", "model_names", "serves"):  # not "acme-*": a, c, ..., *
            if isinstance(value := getattr(self, field), str):
                raise TypeError(f"{field} must be a tuple of strings, e.g. {field}=({value!r},)")
        if self.default_rank is not None and type(self.default_rank) is not int:
            raise TypeError(f"default_rank must be an int or None, not {describe(self.default_rank)}")

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

    def owns(self, model: str) -> bool:
        """Whether the bare model name ``model`` is one of its own (:attr:`model_names`)."""
        name = model.strip().lower()
        return any(fnmatch.fnmatchcase(name, pattern.lower()) for pattern in self.model_names)

    def serves_models_of(self, owner: ProviderDescriptor) -> bool:
        """Whether it serves the model names of ``owner`` (itself included): what it declares
        (:attr:`serves`), or any name when it does not say or its base URL is set elsewhere (a
        gateway behind ``OPENAI_BASE_URL`` may serve any vendor's models)."""
        if self.serves is None or (self.base_url_env and os.environ.get(self.base_url_env)):
            return True
        return owner.name == self.name or owner.name in self.serves or "*" in self.serves

    def login_found(self, env: Mapping[str, str] | None = None) -> str | None:
        """Where this provider's saved login is (see :attr:`find_login`), or None (no login,
        or the provider has none). Raises ``ValueError`` when a saved login cannot be read."""
        if self.find_login is None:
            return None
        finder: LoginFinder = _imported(self.find_login)
        return finder(os.environ if env is None else env)

    def is_available(self) -> bool:
        """Whether a provider that needs no credentials can run here (see :attr:`available`)."""
        if self.available is None:
            return False
        try:
            check: Callable[[], bool] = _imported(self.available)
        except ImportError:
            return False
        return bool(check())


def _imported(value: Any) -> Any:
    """``value``, or the attribute a ``"module:attribute"`` string names, imported."""
    if not isinstance(value, str):
        return value
    module_name, _, attr = value.partition(":")
    return getattr(importlib.import_module(module_name), attr)


#: what a cell shows when the embedded model runs for lack of a login or key
EMBEDDED_MODEL_NOTE = (
    "Using the embedded local model SmolLM2-135M; run %chat login to use GitHub Copilot, "
    "or set OPENAI_API_KEY / ANTHROPIC_API_KEY"
)

_lock = threading.Lock()
_BUILTIN: tuple[ProviderDescriptor, ...] = (
    ProviderDescriptor(
        "copilot", "dispatch_nb.providers.copilot:CopilotAdapter", display_name="GitHub Copilot",
        default_model="gpt-4.1", default_max_tokens=8192,
        login_hint="Run `%chat login` to sign in to GitHub Copilot (or set "
                   "DISPATCH_NB_GITHUB_TOKEN).",
        secret_env=("DISPATCH_NB_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "COPILOT_API_KEY"),
        login_flow="github-device", find_login="dispatch_nb.providers.github_login:find_login",
        premium_multiplier=True, default_rank=0, price_provider="github-copilot",
        serves=("openai", "anthropic"),
    ),
    ProviderDescriptor(
        "openai", "dispatch_nb.providers.openai:OpenAIAdapter", display_name="OpenAI",
        key_env="OPENAI_API_KEY", default_model="gpt-4.1", default_max_tokens=4096,
        default_rank=10, base_url_env="OPENAI_BASE_URL", price_provider="openai",
        model_names=("gpt-*", "chatgpt-*", "o[134]", "o[134]-*"), serves=(),
    ),
    ProviderDescriptor(
        "compatible", "dispatch_nb.providers.openai:connect_compatible",
        display_name="OpenAI-compatible server", key_env="DISPATCH_NB_COMPATIBLE_API_KEY",
        default_model="llama3", default_max_tokens=4096, listing_model="default",
        base_url_env="DISPATCH_NB_COMPATIBLE_BASE_URL", serves=("*",),
        login_hint="Check the server's API key (`%chat key compatible`, or "
                   "DISPATCH_NB_COMPATIBLE_API_KEY in the environment) and "
                   "DISPATCH_NB_COMPATIBLE_BASE_URL.",
    ),
    ProviderDescriptor(
        "anthropic", "dispatch_nb.providers.anthropic:AnthropicAdapter", display_name="Anthropic",
        key_env="ANTHROPIC_API_KEY", default_model="claude-sonnet-4-5", default_max_tokens=4096,
        default_rank=20, base_url_env="ANTHROPIC_BASE_URL", price_provider="anthropic",
        model_names=("claude-*",), serves=(),
    ),
    ProviderDescriptor(
        "local", "dispatch_nb.providers.local:LocalAdapter", display_name="Embedded model",
        default_model="smollm2", default_max_tokens=512,
        available="dispatch_nb.providers.local:local_model_available", default_rank=1000,
        default_note=EMBEDDED_MODEL_NOTE, serves=(), free=True,
    ),
    ProviderDescriptor(
        "fake", "dispatch_nb.providers.fake:CanonicalAdapter", display_name="Fake (canonical protocol)",
        default_model="echo", default_max_tokens=1024, serves=("*",),
    ),
)
_providers: dict[str, ProviderDescriptor] = {d.name: d for d in _BUILTIN}


def _note_price(descriptor: ProviderDescriptor) -> None:
    """Tell :mod:`dispatch_nb.cost` how ``descriptor``'s answers are priced."""
    PRICE_PROVIDERS[descriptor.name] = descriptor.price_provider
    if descriptor.free:
        FREE_PROVIDERS.add(descriptor.name)
    else:
        FREE_PROVIDERS.discard(descriptor.name)


for _descriptor in _BUILTIN:
    _note_price(_descriptor)
#: the names registered by dispatch_nb itself
BUILTIN_PROVIDERS = frozenset(_providers)
_plugins_loaded = False
#: held while the plug-ins load: other threads wait; the loading one may re-enter (a plug-in
#: module that calls register_provider)
_plugins_lock = threading.RLock()
_plugins_started = False
#: why each entry point that could not be loaded was skipped, by its name (said when it is asked for)
_broken_plugins: dict[str, str] = {}


class UnknownProviderError(RequestError, LookupError):
    """No provider is registered under that name."""

    default_code = "unknown_provider"


class ProviderNotSetUpError(AuthenticationError):
    """A bare model name is another vendor's (``gpt-4.1`` is OpenAI's), and neither that vendor's
    provider nor the default provider can take it here: raised before anything is sent. ``spec``
    is the ``provider:model`` to write; ``alternatives`` the specs of providers that serve the
    name too after their login (``copilot:gpt-4.1``)."""

    def __init__(self, message: str, *, spec: str = "", alternatives: tuple[str, ...] = (),
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        #: the ``provider:model`` the name belongs to
        self.spec = spec
        #: other ``provider:model`` specs that would serve it after a login
        self.alternatives = alternatives


def _load_plugins() -> None:
    """Register the providers of the entry-point group :data:`ENTRY_POINT_GROUP`, once (the rules:
    docs/providers.md)."""
    global _plugins_loaded, _plugins_started
    if _plugins_loaded:
        return
    with _plugins_lock:
        if _plugins_started:  # loaded meanwhile, or being loaded by this very thread
            return
        _plugins_started = True
        try:
            _register_plugins()
        except BaseException:  # Ctrl-C during a slow plug-in's import: the next call tries again
            _plugins_started = False
            raise
        _plugins_loaded = True


def _register_plugins() -> None:
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            descriptor = entry.load()  # a ProviderDescriptor, else a factory
            if not isinstance(descriptor, ProviderDescriptor):
                if not callable(descriptor):
                    raise TypeError(f"it holds {type(descriptor).__name__}, not a "
                                    "ProviderDescriptor or a factory")
                descriptor = ProviderDescriptor(entry.name, descriptor)
        except Exception as exc:
            package = f"the package {entry.dist.name}" if entry.dist else "the package declaring it"
            _broken_plugins[entry.name] = (f"provider plug-in {entry.name!r} ({entry.value}) cannot be "
                                           f"loaded: {type(exc).__name__}: {exc}; update or reinstall "
                                           f"{package}, or uninstall it")
            logger.warning("%s", _broken_plugins[entry.name])
            continue
        with _lock:
            if descriptor.name in _providers:  # unless its module registered it itself
                if _providers[descriptor.name] != descriptor:
                    logger.warning("provider plug-in %r (%s) is not used: a provider named %r is "
                                   "already registered", entry.name, entry.value, descriptor.name)
                continue
            _providers[descriptor.name] = descriptor
            _note_price(descriptor)


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
    _load_plugins()
    with _lock:
        if descriptor.name in _providers and not replace:
            raise ValueError(
                f"a provider named {descriptor.name!r} is already registered; pass replace=True "
                "to replace it"
            )
        _providers[descriptor.name] = descriptor
        _note_price(descriptor)


def list_providers() -> list[str]:
    """Names of every registered provider."""
    _load_plugins()
    with _lock:
        return sorted(_providers)


def list_descriptors() -> list[ProviderDescriptor]:
    """Every registered provider's descriptor, in registration order (built-ins first)."""
    _load_plugins()
    with _lock:
        return list(_providers.values())


def get_descriptor(name: str) -> ProviderDescriptor:
    """The descriptor registered under ``name`` (raises :class:`UnknownProviderError`)."""
    descriptor = find_descriptor(name)
    if descriptor is None:
        raise _unknown(name, f"unknown provider {name!r}; available providers: "
                             f"{', '.join(list_providers())}")
    return descriptor


def _unknown(name: str, message: str) -> UnknownProviderError:
    """The error for ``name``: ``message``, or why the installed plug-in of that name was skipped."""
    broken = _broken_plugins.get(name)
    return UnknownProviderError(broken, code="plugin_unloadable") if broken else \
        UnknownProviderError(message)


def find_descriptor(name: str | None) -> ProviderDescriptor | None:
    """The descriptor registered under ``name``, or ``None``."""
    if not name:
        return None
    _load_plugins()
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


def base_url_rows(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(what, URL)`` for the status rows of the server variables that are set, e.g.
    ``("OpenAI base URL", "http://...")``: one row per variable."""
    env = os.environ if env is None else env
    rows: dict[str, tuple[str, str]] = {}
    for descriptor in list_descriptors():
        variable = descriptor.base_url_env
        if variable and variable not in rows and env.get(variable, "").strip():
            rows[variable] = (f"{descriptor.label} base URL", env[variable].strip())
    return list(rows.values())


def get_provider(name: str) -> ProviderFactory:
    """The factory registered under ``name`` (imports a built-in provider on first use)."""
    named = get_descriptor(name).factory
    try:
        return _imported(named)  # type: ignore[no-any-return]
    except ImportError as exc:
        raise ImportError(f"provider {name!r}: its factory {named!r} cannot be imported: {exc}",
                          name=exc.name) from exc


# -- the default model (documented in dispatch_nb.defaults) ------------------------------------------
LOGIN_HINT = (
    "No model is configured: run %chat login to use GitHub Copilot, set OPENAI_API_KEY / "
    "ANTHROPIC_API_KEY, or pip install 'dispatch-nb[local]' for the embedded local model"
)


@dataclass(frozen=True)
class Resolution:
    """The default model spec, why it was chosen, and what to tell the user (or ``""``)."""

    #: a ``provider:model`` spec for :func:`dispatch_nb.connect`
    spec: str
    #: why this spec (for ``%chat status``), e.g. "OPENAI_API_KEY is set"
    reason: str
    #: one line to show the user when they should sign in or know what runs; empty otherwise
    login_hint: str = ""
    #: which rule matched: ``env``, the name of the provider chosen as ready (``copilot``,
    #: ``openai``, ``anthropic``, ``local``, ...), or ``login``
    source: str = ""

    @property
    def needs_login(self) -> bool:
        """True when nothing usable was found and the spec needs a login first."""
        return self.source == "login"


def _ready(descriptor: ProviderDescriptor, env: Mapping[str, str]) -> str | None:
    """Why ``descriptor`` can run here (the reason ``%chat status`` shows), or None."""
    if descriptor.key_env:
        return f"{descriptor.key_env} is set" if env.get(descriptor.key_env, "").strip() else None
    if descriptor.find_login is not None:
        found = descriptor.login_found(env)
        return f"logged in to {descriptor.label} ({found})" if found else None
    if descriptor.is_available():
        return f"no login and no API key is set up; the {descriptor.label.lower()} can run here"
    return None


def resolve_default_model(env: Mapping[str, str] | None = None) -> Resolution:
    """The model to use when none was given (the order: docs/providers.md).

    ``env`` defaults to ``os.environ``. The model and API-key variables, ``DISPATCH_NB_HOME``,
    ``DISPATCH_NB_GITHUB_TOKEN`` and ``DISPATCH_NB_GITHUB_URL`` are read from it; the Copilot
    editor login is looked up where the process's ``HOME`` / ``XDG_CONFIG_HOME`` point.
    """
    env = os.environ if env is None else env
    spec = env.get("DISPATCH_NB_MODEL", "").strip()
    if spec:
        return Resolution(spec, "DISPATCH_NB_MODEL is set", "", "env")
    problems: list[str] = []
    ranked = sorted((d for d in list_descriptors() if d.default_rank is not None),
                    key=lambda d: d.default_rank or 0)
    for descriptor in ranked:
        try:
            reason = _ready(descriptor, env)
        except Exception as exc:  # an unreadable saved login (ValueError), a plug-in's bug: say so
            problems.append(str(exc) if isinstance(exc, ValueError) else
                            f"{descriptor.label} cannot be checked ({type(exc).__name__}: {exc})")
            continue
        if reason is None:
            continue
        if not descriptor.key_env and descriptor.find_login is None:  # runs for lack of others
            reason += "".join(f"; {p}" for p in problems)
        return Resolution(f"{descriptor.name}:{descriptor.example_model}", reason,
                          descriptor.default_note, descriptor.name)
    note = "".join(f"; {p}" for p in problems)
    for descriptor in ranked:
        if descriptor.login_flow:
            return Resolution(f"{descriptor.name}:{descriptor.example_model}",
                              f"needs login{note}", LOGIN_HINT, "login")
    return Resolution("", f"nothing is set up{note}", LOGIN_HINT, "login")


def default_model_spec() -> str:
    """The default model, the one ``%chat status`` and ``python -m dispatch_nb status`` show
    (:func:`resolve_default_model`)."""
    return resolve_default_model().spec


def _choices() -> str:
    def needs(d: ProviderDescriptor) -> str:
        return " (after `%chat login`)" if d.login_flow else f" ({d.key_env})" if d.key_env else ""

    return "write it as provider:model: " + ", ".join(
        f"'{d.name}:MODEL'{needs(d)}" for d in list_descriptors())


def owner_of(model: str) -> ProviderDescriptor | None:
    """The provider whose own model name ``model`` is (:attr:`ProviderDescriptor.model_names`:
    ``gpt-4.1`` is OpenAI's, ``claude-sonnet-4-5`` Anthropic's), or ``None``."""
    return next((d for d in list_descriptors() if d.owns(model)), None)


def _has_credentials(descriptor: ProviderDescriptor) -> bool:
    try:
        return _ready(descriptor, os.environ) is not None
    except Exception:  # a saved login that cannot be read, a plug-in's check that fails
        return False


def _not_set_up(model: str, owner: ProviderDescriptor) -> ProviderNotSetUpError:
    """The error for ``model``, ``owner``'s own, when ``owner`` has no credentials here."""
    spec = f"{owner.name}:{model}"
    others = [d for d in list_descriptors()
              if d is not owner and owner.name in (d.serves or ()) and (d.login_flow or d.key_env)]
    what = f"{owner.label} API key here ({owner.key_env} is not set)" if owner.key_env else \
        f"{owner.label} login here"
    also = "".join(f"; {d.label} serves it too ('{d.name}:{model}', "
                   f"{'after a login' if d.login_flow else f'with {d.key_env}'})" for d in others)
    how = (f"pass connect({spec!r}, api_key=...) or set {owner.key_env}" if owner.key_env
           else f"use connect({spec!r}, ...) after its login")
    return ProviderNotSetUpError(
        f"model {model!r} is one of {owner.label}'s models ({spec!r}), and there is no {what}, "
        f"so nothing was sent (a bare name is not given to another vendor){also}; {how}",
        provider=owner.name, spec=spec, alternatives=tuple(f"{d.name}:{model}" for d in others),
    )


def parse_model_spec(spec: str, default: str | None = None, *, sends: bool = True
                     ) -> tuple[str, str]:
    """``"provider:model"`` → ``(provider, model)``; a bare model name gets the provider of
    ``default`` (a ``provider:model`` spec), else of the default model ``%chat status`` shows
    (:func:`default_model_spec`). When nothing is set up (no ``DISPATCH_NB_MODEL``, login, API
    key or embedded model), a bare name is refused with the choices, rather than sent to a
    provider that would first need a login.

    A bare name that is a vendor's own (:func:`owner_of`: ``gpt-4.1``, ``claude-sonnet-4-5``)
    goes to the default provider only when that provider serves the vendor's models (itself,
    or GitHub Copilot), else to the vendor's provider when its credentials are set up here (or
    ``sends`` is false: a replay sends nothing, so it needs none); otherwise it is refused with
    :class:`ProviderNotSetUpError`, never sent to another vendor.

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
    if sep and find_descriptor(head.strip()) is not None:
        # "openai: gpt-4.1" (a space after the colon, as in prose or a quoted -m option) is
        # openai's gpt-4.1: no model name starts or ends with a space
        head, rest = head.strip(), rest.strip()
        if not rest:
            raise RequestError(f"model spec {head + ':'!r} names provider {head!r} but no model; "
                               f"write it as '{head}:MODEL'")
        return head, rest
    if sep:
        # a word (hyphens too: "local-tools") before a ":" that is no size or path is taken for
        # a provider's name; "llama3:8b", "org/model:tag" stay a compatible server's names
        if head and head.replace("-", "_").isidentifier() and "/" not in rest \
                and not rest[:1].isdigit():
            import difflib

            # (by lower case too: "OpenAI" is most likely openai)
            close = difflib.get_close_matches(head.lower(), list_providers(), n=1)
            where = " (the value of DISPATCH_NB_MODEL)" \
                if spec == os.environ.get("DISPATCH_NB_MODEL", "").strip() else ""
            raise _unknown(head, f"unknown provider {head!r} in model spec {spec!r}{where}"
                                 f"{f' (did you mean {close[0]}?)' if close else ''}; "
                                 f"available providers: {', '.join(list_providers())}")
    elif (named := find_descriptor(spec)) is not None:  # connect("openai") names no model
        raise RequestError(
            f"{spec!r} is a provider, not a model: write it as '{spec}:MODEL' "
            f"(e.g. '{spec}:{named.example_model}')"
        )
    fallback = (default or "").strip()
    owner = owner_of(spec)
    if not fallback:
        resolved = resolve_default_model()
        if resolved.needs_login:  # a bare name must not start a login or reach an unchosen provider
            if owner is not None and (not sends or _has_credentials(owner)):
                return owner.name, spec
            if owner is not None:
                raise _not_set_up(spec, owner)
            raise RequestError(f"model {spec!r}: no provider is set up here, so a bare model name "
                               "has none; " + _choices())
        fallback = resolved.spec
    provider, dsep, _ = fallback.partition(":")
    if not dsep or find_descriptor(provider) is None:
        raise RequestError(
            f"the default model {fallback!r} must be 'provider:model' with a registered "
            f"provider, e.g. 'openai:gpt-4.1'; providers: {', '.join(list_providers())}"
        )
    if owner is not None:
        chosen = find_descriptor(provider)
        if chosen is not None and chosen.serves_models_of(owner):
            return provider, spec
        if not sends or _has_credentials(owner):
            return owner.name, spec
        raise _not_set_up(spec, owner)
    if not sep and re.fullmatch(r"[A-Za-z]+", spec):
        # A plain word without a version or size ("nope", "claude") is no model name: model names
        # carry one (gpt-4.1, claude-sonnet-4-5, llama3, o3); provider:NAME passes any name.
        raise UnknownProviderError(
            f"{spec!r} is neither 'provider:model' nor a model name (model names have a version, "
            f"e.g. 'gpt-4.1', 'claude-sonnet-4-5'); write it as 'provider:model', e.g. "
            f"'{provider}:{spec}' if {provider} really has a model called {spec!r}; "
            f"providers: {', '.join(list_providers())}"
        )
    return provider, spec


def qualify_model_spec(spec: str, default: str | None = None, *, sends: bool = True) -> str:
    """``spec`` as ``"provider:model"`` (see :func:`parse_model_spec`)."""
    provider, model = parse_model_spec(spec, default, sends=sends)
    return f"{provider}:{model}"


class _Default:
    """The value of an omitted ``spec`` (None is refused: it is usually a variable left unset)."""

    def __repr__(self) -> str:
        return "<the default model>"


_DEFAULT_SPEC: Any = _Default()


def connect(spec: str = _DEFAULT_SPEC, **options: Any) -> Adapter:
    """An adapter for ``spec`` (``"provider:model"``, or a model name of the default provider
    ``%chat status`` shows: see :func:`parse_model_spec`); without ``spec``, the default model
    (:func:`default_model_spec`). ``options`` go to the provider's constructor.

    A spec that cannot be right fails here, before any request, with a ``RequestError`` that
    says what to write: an unknown provider or a word that is no model name
    (:class:`UnknownProviderError`), a provider's name alone (``connect("openai")``); ``None`` or
    a non-string is a ``TypeError``."""
    if isinstance(spec, _Default):
        spec = default_model_spec()
    elif not isinstance(spec, str):
        raise TypeError(
            "connect() takes a model spec 'provider:model' (e.g. 'openai:gpt-4.1'), or nothing "
            f"for the default model ({default_model_spec()}) — not {describe(spec)}"
        )
    provider, model = parse_model_spec(spec)
    adapter = get_provider(provider)(model, **options)
    if not isinstance(adapter, Adapter):
        raise TypeError(f"the factory of provider {provider!r} returned {describe(adapter)}, "
                        "not an Adapter")
    return adapter
