"""Which model to use when nobody said: :func:`resolve_default_model`.

First match wins:

1. ``DISPATCH_NB_MODEL`` (any ``provider:model`` spec);
2. the registered providers with a ``default_rank``, lowest rank first, each with its
   ``default_model`` — when it is ready here (:class:`~dispatch_nb.registry.ProviderDescriptor`):
   a provider with a login when its ``find_login`` finds one (GitHub Copilot, rank 0: a GitHub
   token in ``DISPATCH_NB_GITHUB_TOKEN``, our token file, or a Copilot editor login), a provider
   with an API key when its ``key_env`` is set (OpenAI, rank 10: ``OPENAI_API_KEY``; Anthropic,
   rank 20: ``ANTHROPIC_API_KEY``), a provider that needs neither when it is ``available`` (the
   embedded local model, rank 1000, when the ``local`` extra is installed: with a one-line hint on
   how to sign in for a stronger model);
3. otherwise the first-ranked provider with a login (Copilot), marked as needing a login.

A bare model name (``-m gpt-4.1-mini``, ``connect("gpt-4.1-mini")``) belongs to the provider chosen
here (:func:`dispatch_nb.registry.parse_model_spec`); in case 3 it is refused with the choices.

It is cheap enough to call on every cell: it reads the environment and a few small files; it never
loads a model, imports llama.cpp, or touches the network.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .registry import EMBEDDED_MODEL_NOTE, ProviderDescriptor, list_descriptors

__all__ = [
    "LOCAL_HINT",
    "LOGIN_HINT",
    "Resolution",
    "resolve_default_model",
]

#: what a cell shows when the embedded model runs for lack of a login or key (its descriptor's
#: ``default_note``)
LOCAL_HINT = EMBEDDED_MODEL_NOTE
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


def _ranked() -> list[ProviderDescriptor]:
    """The registered providers that may be the default, in order (their ``default_rank``)."""
    ranked = [d for d in list_descriptors() if d.default_rank is not None]
    return sorted(ranked, key=lambda d: d.default_rank or 0)


def _ready(descriptor: ProviderDescriptor, env: Mapping[str, str]) -> str | None:
    """Why ``descriptor`` can run here (the reason ``%chat status`` shows), or None."""
    if descriptor.key_env:
        return f"{descriptor.key_env} is set" if env.get(descriptor.key_env, "").strip() else None
    if descriptor.find_login is not None:
        found = descriptor.login_found(env)
        return f"a {descriptor.label} login was found ({found})" if found else None
    if descriptor.is_available():
        return f"no login and no API key is set up; the {descriptor.label.lower()} can run here"
    return None


def resolve_default_model(env: Mapping[str, str] | None = None) -> Resolution:
    """The model to use when none was given (see the module docstring for the order).

    ``env`` defaults to ``os.environ``. The model and API-key variables, ``DISPATCH_NB_HOME``,
    ``DISPATCH_NB_GITHUB_TOKEN`` and ``DISPATCH_NB_GITHUB_URL`` are read from it; the Copilot
    editor login is looked up where the process's ``HOME`` / ``XDG_CONFIG_HOME`` point.
    """
    env = os.environ if env is None else env
    spec = env.get("DISPATCH_NB_MODEL", "").strip()
    if spec:
        return Resolution(spec, "DISPATCH_NB_MODEL is set", "", "env")
    problems: list[str] = []
    ranked = _ranked()
    for descriptor in ranked:
        try:
            reason = _ready(descriptor, env)
        except ValueError as exc:  # a saved login that cannot be read: say so, choose another
            problems.append(str(exc))
            continue
        if reason is None:
            continue
        hint = descriptor.default_note
        if not descriptor.key_env and descriptor.find_login is None:  # runs for lack of others
            reason += "".join(f"; {p}" for p in problems)
        return Resolution(f"{descriptor.name}:{descriptor.example_model}", reason, hint,
                          descriptor.name)
    note = "".join(f"; {p}" for p in problems)
    for descriptor in ranked:
        if descriptor.login_flow:
            return Resolution(f"{descriptor.name}:{descriptor.example_model}",
                              f"needs login{note}", LOGIN_HINT, "login")
    return Resolution("", f"nothing is set up{note}", LOGIN_HINT, "login")
