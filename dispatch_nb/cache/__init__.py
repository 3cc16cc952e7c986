"""Record and replay model answers: a response cache kept in a reviewable file beside a notebook.

::

    from dispatch_nb import connect
    from dispatch_nb.cache import CachedAdapter, ResponseCache

    cache = ResponseCache("lesson.dispatch-cache.jsonl", mode="record")   # or DISPATCH_NB_CACHE
    model = CachedAdapter(connect("local:smollm2"), cache, label="cell 3")
    model.chat("Explain recursion in one sentence.")        # answered by the model, recorded
    # later, offline: mode="replay" gives the recorded answer, identical, and sends nothing

Modes (``mode=``, else ``$DISPATCH_NB_CACHE``, else ``off``): ``off`` (every call goes to the
model), ``read-write`` (replay what is recorded, record what is missing), ``replay`` (recorded
answers only; a missing one raises :class:`CacheMissError`), ``record`` (ask the model, record
the answer).

docs/record-replay.md says what makes two requests the same (:func:`cache_key`), the JSON-lines
file and its locking (:class:`ResponseCache`), how replay streams, and which secrets are never
written (:func:`scrub_secrets`). One module per job: :mod:`~dispatch_nb.cache.keys`,
:mod:`~dispatch_nb.cache.store` and :mod:`~dispatch_nb.cache.adapter`; the public names are
importable from ``dispatch_nb.cache`` itself.
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
