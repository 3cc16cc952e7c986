"""Which server a key from the environment belongs to: a credential goes only to its own host
(docs/providers.md, "Credentials: a key goes only to its own server").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["EnvCredentials"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


@dataclass(frozen=True)
class EnvCredentials:
    """A provider's environment settings: ``key_env`` is the key for the server ``url_env`` names
    (``default_url`` when it is unset)."""

    key_env: str
    url_env: str
    default_url: str

    def base_url(self, explicit: str | None, env: Mapping[str, str] | None = None) -> str:
        """Where requests go: ``explicit``, else ``url_env``, else ``default_url``."""
        env = os.environ if env is None else env
        return (explicit or env.get(self.url_env, "").strip() or self.default_url).rstrip("/")

    def key_for(self, url: str, env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
        """The environment's key when it belongs to ``url``'s server, and — when a key is set but
        kept back — why (naming the variables and servers, never the key)."""
        env = os.environ if env is None else env
        key = env.get(self.key_env, "").strip()
        if not key:
            return None, ""
        home = self.base_url(None, env)  # the server the key belongs to
        if _origin(url) == _origin(home):  # the same server: scheme, host and port
            return key, ""
        where = (f"the server {self.url_env} names ({home})" if env.get(self.url_env, "").strip()
                 else f"{home} ({self.url_env} is not set)")
        return None, (
            f"{self.key_env} is for {where}, so it is not sent to {url}: pass api_key= together "
            f"with base_url= for that server, or set {self.url_env} to it"
        )
