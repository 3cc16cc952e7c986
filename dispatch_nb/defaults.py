"""Which model to use when nobody said: :func:`resolve_default_model`.

First match wins:

1. ``DISPATCH_NB_MODEL`` (any ``provider:model`` spec);
2. GitHub Copilot (``copilot:gpt-4.1``) when a GitHub token can be found
   (``DISPATCH_NB_GITHUB_TOKEN``, our token file, or a Copilot editor login);
3. OpenAI (``openai:gpt-4.1``) when ``OPENAI_API_KEY`` is set;
4. Anthropic (``anthropic:claude-sonnet-4-5``) when ``ANTHROPIC_API_KEY`` is set — in general,
   every registered provider whose descriptor has a ``key_env`` and a ``default_rank``, by rank
   (:class:`~dispatch_nb.registry.ProviderDescriptor`), with its ``default_model``;
5. the embedded local model (``local:smollm2``) when the ``local`` extra is installed, with a
   one-line hint on how to sign in for a stronger model;
6. otherwise Copilot, marked as needing a login.

It is cheap enough to call on every cell: it reads the environment and a few small files; it never
loads a model, imports llama.cpp, or touches the network.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .registry import ProviderDescriptor, list_descriptors

__all__ = [
    "ANTHROPIC_DEFAULT",
    "COPILOT_DEFAULT",
    "LOCAL_DEFAULT",
    "OPENAI_DEFAULT",
    "Resolution",
    "resolve_default_model",
]

COPILOT_DEFAULT = "copilot:gpt-4.1"
OPENAI_DEFAULT = "openai:gpt-4.1"
ANTHROPIC_DEFAULT = "anthropic:claude-sonnet-4-5"
LOCAL_DEFAULT = "local:smollm2"

LOCAL_HINT = (
    "Using the embedded local model SmolLM2-135M; run %chat login to use GitHub Copilot, "
    "or set OPENAI_API_KEY / ANTHROPIC_API_KEY"
)
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
    #: which rule matched: ``env``, ``copilot``, ``openai``, ``anthropic`` (the provider's name
    #: for any provider chosen by its key), ``local``, ``login``
    source: str = ""

    @property
    def needs_login(self) -> bool:
        """True when nothing usable was found and the spec needs a Copilot login first."""
        return self.source == "login"


def _copilot_token(env: Mapping[str, str]) -> tuple[str | None, str]:
    """Where a GitHub token for Copilot is (a description, never the token), and any problem."""
    try:
        from .auth.token_store import find_github_token
    except ImportError:  # the auth package is optional in stripped-down installs
        has_token = bool(env.get("DISPATCH_NB_GITHUB_TOKEN", "").strip())
        return ("DISPATCH_NB_GITHUB_TOKEN" if has_token else None), ""
    explicit = env.get("DISPATCH_NB_GITHUB_TOKEN", "").strip() or None
    home = env.get("DISPATCH_NB_HOME", "").strip()
    token_path = Path(home).expanduser() / "github_token.json" if home else None
    github_url = env.get("DISPATCH_NB_GITHUB_URL", "").strip() or None
    try:
        found = find_github_token(explicit, token_path=token_path, github_url=github_url)
    except Exception as exc:  # a corrupt token file must not break the choice of a model
        return None, f"the saved GitHub login cannot be read ({exc})"
    if found is None:
        return None, ""
    source = "DISPATCH_NB_GITHUB_TOKEN" if found.source == "argument" else found.source
    return source, ""


def _ranked_key_providers() -> list[ProviderDescriptor]:
    """The registered providers an API key in the environment makes the default, in order
    (their descriptors' ``default_rank``: OpenAI, then Anthropic, then any registered later)."""
    ranked = [d for d in list_descriptors() if d.key_env and d.default_rank is not None]
    return sorted(ranked, key=lambda d: d.default_rank or 0)


def _local_available() -> bool:
    try:
        from .providers.local import local_model_available
    except ImportError:
        return False
    return local_model_available()


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
    token_source, problem = _copilot_token(env)
    if token_source is not None:
        return Resolution(COPILOT_DEFAULT, f"a GitHub login was found ({token_source})", "",
                          "copilot")
    for descriptor in _ranked_key_providers():
        assert descriptor.key_env is not None
        if env.get(descriptor.key_env, "").strip():
            return Resolution(f"{descriptor.name}:{descriptor.example_model}",
                              f"{descriptor.key_env} is set", "", descriptor.name)
    note = f"; {problem}" if problem else ""
    if _local_available():
        return Resolution(
            LOCAL_DEFAULT,
            f"no GitHub login and no API key; the local extra is installed{note}",
            LOCAL_HINT,
            "local",
        )
    return Resolution(COPILOT_DEFAULT, f"needs login{note}", LOGIN_HINT, "login")
