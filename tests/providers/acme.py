"""Acme: a whole provider in one module, as ``docs/providers.md`` shows.

Acme's servers speak dispatch_nb's canonical protocol behind an API key (``ACME_API_KEY``). The
module is the adapter and one registration; the contract suite runs it as the ``acme`` target
(``tests/contract/targets.py``). Importing it registers the provider.
"""

from __future__ import annotations

import os
from typing import Any

from dispatch_nb.errors import AuthenticationError
from dispatch_nb.providers.fake import CanonicalAdapter
from dispatch_nb.registry import ProviderDescriptor, register_provider

DEFAULT_URL = "https://api.acme.invalid/v1"


class AcmeAdapter(CanonicalAdapter):
    """Acme's chat models: the canonical protocol, authenticated with ``ACME_API_KEY``."""

    def __init__(
        self,
        model: str = "acme-1",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = 2048,
        **options: Any,
    ) -> None:
        key = api_key or os.environ.get("ACME_API_KEY", "").strip()
        if not key:
            raise AuthenticationError(
                "Acme needs an API key: pass api_key= or set ACME_API_KEY", provider="acme"
            )
        super().__init__(model, base_url=base_url or os.environ.get("ACME_BASE_URL", DEFAULT_URL),
                         api_key=key, max_tokens=max_tokens, **options)

    @property
    def provider_name(self) -> str:
        return "acme"

    @property
    def display_name(self) -> str:
        return "Acme"


DESCRIPTOR = ProviderDescriptor(
    "acme",
    AcmeAdapter,
    display_name="Acme",
    key_env="ACME_API_KEY",
    default_model="acme-1",
    default_max_tokens=2048,
    default_rank=30,  # chosen by default after OpenAI and Anthropic when its key is set
)
register_provider(DESCRIPTOR, replace=True)
