"""Record and replay model answers: a response cache kept in a reviewable file beside a notebook.

:class:`ResponseCache` (the file and its mode), :class:`CachedAdapter` (an adapter behind it),
:func:`cache_key`, :func:`scrub_secrets`. The guide: docs/record-replay.md.
"""

from __future__ import annotations

from .adapter import CachedAdapter, cached_model
from .keys import cache_key, scrub_secrets
from .store import (
    CACHE_MODES,
    CACHE_SUFFIX,
    CacheMissError,
    ResponseCache,
    default_cache_path,
    resolve_cache_mode,
)

__all__ = [
    "CACHE_MODES",
    "CACHE_SUFFIX",
    "CacheMissError",
    "CachedAdapter",
    "ResponseCache",
    "cache_key",
    "cached_model",
    "default_cache_path",
    "resolve_cache_mode",
    "scrub_secrets",
]
