"""Short-lived HTTP clients for the auth calls, sharing one TLS context.

A login or a token exchange is a request or two, so each gets its own client (no pool to close,
no event-loop affinity). The TLS context (loading the CA bundle takes tens of milliseconds)
is the one :func:`dispatch_nb.transport.tls_context` shares with every client.
"""

from __future__ import annotations

import httpx

from ..transport import tls_context

__all__ = ["async_client", "sync_client"]


def sync_client(timeout: float) -> httpx.Client:
    """A new ``httpx.Client`` with the shared TLS context."""
    return httpx.Client(timeout=timeout, verify=tls_context())


def async_client(timeout: float) -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` with the shared TLS context."""
    return httpx.AsyncClient(timeout=timeout, verify=tls_context())
