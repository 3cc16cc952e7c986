"""Record and replay model answers: a response cache kept in a reviewable file beside a notebook.

::

    from dispatch_nb import connect
    from dispatch_nb.cache import CachedAdapter, ResponseCache

    cache = ResponseCache("lesson.dispatch-cache.jsonl", mode="record")   # or DISPATCH_NB_CACHE
    model = CachedAdapter(connect("local:smollm2"), cache, label="cell 3")
    model.chat("Explain recursion in one sentence.")        # answered by the model, recorded
    # later, offline, on a student's laptop or on binder:
    model = CachedAdapter(connect("local:smollm2"), ResponseCache("lesson.dispatch-cache.jsonl",
                                                                  mode="replay"))
    model.chat("Explain recursion in one sentence.")        # the recorded answer, identical

Modes (``mode=`` argument, else ``$DISPATCH_NB_CACHE``, else ``off``):

* ``off``: no cache, every call goes to the model.
* ``read-write``: a recorded answer is replayed; a missing one is asked of the model and recorded.
* ``replay``: only recorded answers; a missing one raises :class:`CacheMissError` (nothing is sent).
* ``record``: every call goes to the model and its answer is recorded (replacing an older one).

The **key** of an answer is the SHA-256 of a canonical JSON (sorted keys, ASCII, no object ids) of
everything that shapes it: provider, model, system prompt, tools, ``max_tokens``, ``temperature``,
the other chat options, the structured output asked for (``output=``: schema, name, mode), and the
final messages (after notebook interpolation). Retries and extra
HTTP headers are not part of it; neither is ``stream``: a streamed and a plain call share answers.

The **file** is JSON Lines, one answer per line (see docs/record-replay.md for why not SQLite)::

    {"v": 1, "key": "…", "provider": "local", "model": "smollm2", "created": "2025-…Z",
     "label": "cell 3", "request": {"messages": 1, "last_user": "Explain recursion…"},
     "streamed": true, "deltas": [{"t": 0.041, "type": "text_delta", "text": "Recursion"}, …],
     "response": {…the Response as JSON…}}

``t`` is seconds since the request was sent. New answers are appended under a lock (and an
``flock`` where the OS has one, so several kernels can share a file); re-recording an answer rewrites
the file atomically with that line replaced in place, so the file never holds duplicates and a
re-recorded cell shows up in a review diff as exactly one changed line. (The cross-process lock is
an ``flock`` on the file's directory, so no lock file is left beside the notebook.) When a file does hold
duplicates (e.g. after a git merge), the last line wins.

**Replay** streams the recorded deltas, instantly or at the recorded pace (``pace="recorded"``),
and ends in a ``Response`` equal (``==``) to the recorded one. ``timeout`` and ``cancel`` work as
for a live call.

**Secrets** are never written: every stored string is scanned for API keys and tokens (``sk-…``,
``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_…``, ``github_pat_…``, ``Bearer …``, Copilot session
tokens) and for the actual key values of the wrapped adapter and of the usual environment
variables; each is replaced by ``[REDACTED]``.

The file beside a notebook: :func:`default_cache_path` (``$DISPATCH_NB_CACHE_FILE``, else
``<notebook>.dispatch-cache.jsonl`` when Jupyter tells the kernel its notebook, else
``dispatch-cache.jsonl`` in the working directory).

The package has one module per job: :mod:`~dispatch_nb.cache.keys` (the key and secret
scrubbing), :mod:`~dispatch_nb.cache.store` (the JSONL file, modes and paths) and
:mod:`~dispatch_nb.cache.adapter` (the :class:`CachedAdapter` wrapper); the public names are
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
