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

# The resolution lives in the registry (which reads it for bare model names, and which this
# module would otherwise import in a cycle); this module is its documented home.
from .registry import (
    EMBEDDED_MODEL_NOTE as LOCAL_HINT,
)
from .registry import (
    LOGIN_HINT,
    Resolution,
    resolve_default_model,
)

__all__ = [
    "LOCAL_HINT",
    "LOGIN_HINT",
    "Resolution",
    "resolve_default_model",
]
