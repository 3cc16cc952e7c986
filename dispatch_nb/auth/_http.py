"""Short-lived HTTP clients for the auth calls, sharing one TLS context.

A login or a token exchange is a request or two, so each gets its own client (no pool to close,
no event-loop affinity). Building a TLS context loads the CA bundle (tens of milliseconds), so
that part is done once per process and reused.
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["async_client", "sync_client"]


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    # the same context httpx would build per client (honours SSL_CERT_FILE / SSL_CERT_DIR)
    return httpx.create_ssl_context()


def sync_client(timeout: float) -> httpx.Client:
    """A new ``httpx.Client`` with the shared TLS context."""
    return httpx.Client(timeout=timeout, verify=_tls_context())


def async_client(timeout: float) -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` with the shared TLS context."""
    return httpx.AsyncClient(timeout=timeout, verify=_tls_context())
