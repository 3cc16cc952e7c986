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
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from .adapter import Adapter, ChatRequest, ValidationResult
from .cancel import CancelToken
from .errors import RequestError
from .stream import Accumulator, AsyncResponseStream, ResponseStream
from .types import (
    ModelInfo,
    Response,
    StreamDelta,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolUseBlock,
)

try:  # POSIX; elsewhere the in-process lock alone guards writes
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CACHE_MODES",
    "CACHE_SUFFIX",
    "CacheMissError",
    "CachedAdapter",
    "ResponseCache",
    "cache_key",
    "default_cache_path",
    "resolve_cache_mode",
    "scrub_secrets",
]

log = logging.getLogger("dispatch_nb")

CacheMode = Literal["off", "read-write", "replay", "record"]
#: every mode, in the order the docs list them
CACHE_MODES: tuple[str, ...] = ("off", "read-write", "replay", "record")
#: the file-name suffix of a notebook's cache file
CACHE_SUFFIX = ".dispatch-cache.jsonl"
FORMAT_VERSION = 1
REDACTED = "[REDACTED]"
#: options that do not change the answer (and may hold secrets): left out of the key
_KEY_IGNORED_OPTIONS = frozenset({"max_retries", "extra_headers"})
_PREVIEW_CHARS = 200


class CacheMissError(RequestError):
    """Replay mode found no recorded answer for this request. The message names the cell (its
    ``label``) or the prompt, the cache file, and how to record it."""

    default_code = "cache_miss"

    def __init__(self, message: str, *, key: str = "", label: str | None = None,
                 path: Path | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        #: the cache key that was looked up
        self.key = key
        #: the caller's label (e.g. "cell 3"), if any
        self.label = label
        #: the cache file
        self.path = path


# -- modes and paths ------------------------------------------------------------------------------
def resolve_cache_mode(mode: str | None = None) -> CacheMode:
    """``mode``, else ``$DISPATCH_NB_CACHE``, else ``off``; checked against :data:`CACHE_MODES`."""
    value = (mode if mode is not None else os.environ.get("DISPATCH_NB_CACHE", "")).strip().lower()
    value = value or "off"
    if value not in CACHE_MODES:
        source = "mode" if mode is not None else "DISPATCH_NB_CACHE"
        raise ValueError(
            f"{source}={value!r} is not a cache mode; use one of {', '.join(CACHE_MODES)}"
        )
    return value  # type: ignore[return-value]


def default_cache_path(env: dict[str, str] | None = None) -> Path:
    """Where a notebook's answers are kept.

    ``$DISPATCH_NB_CACHE_FILE``; else, when Jupyter tells the kernel its notebook
    (``$JPY_SESSION_NAME``, set by jupyter-server 2), ``<notebook>.dispatch-cache.jsonl`` beside
    it; else ``dispatch-cache.jsonl`` in the working directory. Notebooks that must find their file
    wherever they run (nbval, nbclient, binder) should name it explicitly.
    """
    env = dict(os.environ) if env is None else env
    explicit = env.get("DISPATCH_NB_CACHE_FILE", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    session = env.get("JPY_SESSION_NAME", "").strip()
    if session.endswith(".ipynb"):
        notebook = Path(session)
        return notebook.with_name(notebook.stem + CACHE_SUFFIX)
    return Path("dispatch-cache.jsonl")


# -- keys -----------------------------------------------------------------------------------------
def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"),
                      allow_nan=False)


def _key_material(provider: str, model: str, request: ChatRequest) -> dict[str, Any]:
    messages = [
        {
            "role": m.role,
            "content": [b.model_dump(mode="json", exclude_none=True) for b in m.blocks],
        }
        for m in request.messages
    ]
    tools = [
        t.model_dump(mode="json") if isinstance(t, ToolDefinition) else t for t in request.tools
    ]
    options = {k: v for k, v in request.options.items() if k not in _KEY_IGNORED_OPTIONS}
    material = {
        "v": FORMAT_VERSION,
        "provider": provider,
        "model": model,
        "system": request.system,
        "tools": tools,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "options": options,
        "messages": messages,
    }
    if request.output is not None:  # structured output (absent otherwise: older keys unchanged)
        material["output"] = request.output.key_material()
    return material


def cache_key(provider: str, model: str, request: ChatRequest) -> str:
    """The hex SHA-256 key of a request: the same on every run, machine and Python version.

    A ``str`` message and a message holding one equal ``TextBlock`` have the same key.
    """
    material = _canonical(_key_material(provider, model, request))
    return hashlib.sha256(material.encode("ascii")).hexdigest()


# -- secrets --------------------------------------------------------------------------------------
_SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # "Bearer <credential>": the credential has a digit, so prose ("bearer bonds") is left alone
    (re.compile(r"(?i)\b(bearer)(\s+)(?=[A-Za-z0-9._~+/=\-]*[0-9])[A-Za-z0-9._~+/=\-]{8,}"),
     rf"\1\2{REDACTED}"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\btid=[0-9a-f]{8,};[^\s\"']*"), REDACTED),  # Copilot session tokens
)
#: environment variables always scrubbed, whatever is registered; every registered provider's
#: ``key_env`` and ``secret_env`` (its :class:`~dispatch_nb.registry.ProviderDescriptor`) too
_SECRET_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DISPATCH_NB_GITHUB_TOKEN", "GITHUB_TOKEN",
               "GH_TOKEN", "COPILOT_API_KEY")


def secret_env_names() -> list[str]:
    """The environment variables whose values a cache never writes."""
    from .registry import list_descriptors

    names = dict.fromkeys(_SECRET_ENV)
    for descriptor in list_descriptors():
        names.update(dict.fromkeys(descriptor.secret_env_names))
    return list(names)
_SECRET_ATTR = re.compile(r"(?i)(api_?key|token|secret|password|authorization)")
_MIN_SECRET = 8


#: fields holding opaque provider data (signatures, encrypted reasoning): a base64 blob can contain
#: "-sk-…" by chance, so only exact known secret values are replaced there, never patterns
_OPAQUE_KEYS = frozenset({"signature", "encrypted_content", "data", "provider_data",
                          "reasoning_opaque"})


def scrub_secrets(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (str, list, dict, nested) with every secret-looking string and every value in
    ``secrets`` replaced by ``[REDACTED]``. Dict keys are scrubbed too. Inside opaque fields
    (signatures, encrypted reasoning, ``provider_data``) only the exact ``secrets`` are replaced,
    so a replayed signature stays byte-for-byte what the provider issued."""
    known = sorted({s for s in secrets if s and len(s) >= _MIN_SECRET}, key=len, reverse=True)

    def text(s: str, opaque: bool) -> str:
        for secret in known:
            if secret in s:
                s = s.replace(secret, REDACTED)
        if not opaque:
            for pattern, replacement in _SECRET_PATTERNS:
                s = pattern.sub(replacement, s)
        return s

    def walk(v: Any, opaque: bool) -> Any:
        if isinstance(v, str):
            return text(v, opaque)
        if isinstance(v, dict):
            return {
                (text(k, opaque) if isinstance(k, str) else k):
                    walk(x, opaque or (isinstance(k, str) and k in _OPAQUE_KEYS))
                for k, x in v.items()
            }
        if isinstance(v, (list, tuple)):
            return [walk(x, opaque) for x in v]
        return v

    return walk(value, False)


def _adapter_secrets(adapter: Any, depth: int = 2) -> set[str]:
    """String attributes named like keys/tokens on the adapter (and objects it holds)."""
    found: set[str] = set()
    seen: set[int] = set()

    def visit(obj: Any, level: int) -> None:
        if id(obj) in seen or level < 0:
            return
        seen.add(id(obj))
        try:
            attrs = vars(obj)
        except TypeError:
            return
        for name, value in attrs.items():
            if isinstance(value, str):
                if _SECRET_ATTR.search(name) and len(value) >= _MIN_SECRET:
                    found.add(value)
            elif type(value).__module__.startswith("dispatch_nb"):
                visit(value, level - 1)

    visit(adapter, depth)
    return found


# -- the file -------------------------------------------------------------------------------------
_path_locks: dict[str, threading.Lock] = {}
_path_locks_guard = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    key = str(path.resolve())
    with _path_locks_guard:
        lock = _path_locks.get(key)
        if lock is None:
            lock = _path_locks[key] = threading.Lock()
        return lock


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace(
        "+00:00", "Z"
    )


def _preview(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 1] + "…"


def _last_user_text(request: ChatRequest) -> str:
    for message in reversed(request.messages):
        if message.role == "user":
            text = message.text
            if text:
                return text
            kinds = sorted({b.type for b in message.blocks})
            return f"({', '.join(kinds)})"
    return ""


def _dump_json_line(entry: dict[str, Any]) -> bytes:
    return (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


class ResponseCache:
    """One JSON-lines file of recorded answers, and the mode it is used in.

    ``path`` defaults to :func:`default_cache_path`; ``mode`` to ``$DISPATCH_NB_CACHE`` (else
    ``off``); ``pace`` is how replays stream: ``"instant"`` or ``"recorded"`` (the deltas arrive
    at the times they were recorded). ``secrets``: more values never to write.
    Safe to share between threads; several processes may append to one file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        mode: str | None = None,
        *,
        pace: Literal["instant", "recorded"] = "instant",
        secrets: Iterable[str] = (),
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self.mode: CacheMode = resolve_cache_mode(mode)
        if pace not in ("instant", "recorded"):
            raise ValueError(f"pace must be 'instant' or 'recorded', not {pace!r}")
        self.pace = pace
        self._secrets = set(secrets)
        self._lock = _lock_for(self.path)
        self._entries: dict[str, dict[str, Any]] = {}
        self._stamp: tuple[int, int, int] | None = None

    def __repr__(self) -> str:
        return f"ResponseCache(path={str(self.path)!r}, mode={self.mode!r}, pace={self.pace!r})"

    # -- modes -----------------------------------------------------------------------------------
    @property
    def reads(self) -> bool:
        """Whether recorded answers are replayed (``read-write`` and ``replay``)."""
        return self.mode in ("read-write", "replay")

    @property
    def writes(self) -> bool:
        """Whether new answers are recorded (``read-write`` and ``record``)."""
        return self.mode in ("read-write", "record")

    def add_secret(self, value: str) -> None:
        """Never write ``value`` (e.g. a key this cache's adapters use)."""
        self._secrets.add(value)

    def secrets(self) -> set[str]:
        """The values scrubbed besides the patterns: registered ones and the usual env vars."""
        values = set(self._secrets)
        for name in secret_env_names():
            value = os.environ.get(name, "").strip()
            if value:
                values.add(value)
        return values

    # -- reading ---------------------------------------------------------------------------------
    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _refresh(self) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        entries: dict[str, dict[str, Any]] = {}
        if stamp is not None:
            with open(self.path, "rb") as fh:
                for number, raw in enumerate(fh, 1):
                    if not raw.strip():
                        continue
                    try:
                        entry = json.loads(raw)
                        key = entry["key"]
                        if not isinstance(key, str) or not isinstance(entry["response"], dict):
                            raise TypeError("not an entry")
                    except (ValueError, KeyError, TypeError):
                        log.warning("%s line %d is not a cache entry; ignoring it", self.path,
                                    number)
                        continue
                    entries[key] = entry  # the last line with a key wins
        self._entries = entries
        self._stamp = stamp

    def entries(self) -> list[dict[str, Any]]:
        """Every recorded entry, in file order (duplicates resolved: last wins)."""
        with self._lock:
            self._refresh()
            return list(self._entries.values())

    def __len__(self) -> int:
        return len(self.entries())

    def get(self, key: str) -> dict[str, Any] | None:
        """The recorded entry for ``key``, or None."""
        with self._lock:
            self._refresh()
            return self._entries.get(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    # -- writing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """The in-process lock plus an exclusive flock on the file's directory (other processes)."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if fcntl is None:
                yield
                return
            # The lock is on the directory: the cache file itself is replaced by rewrites, and a
            # lock file beside a notebook would clutter the repository.
            try:
                fd = os.open(self.path.parent, os.O_RDONLY)
            except OSError:
                yield
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def put(self, entry: dict[str, Any], *, secrets: Iterable[str] = ()) -> dict[str, Any]:
        """Write one entry (scrubbed); a new key is appended, a known key's line is replaced in
        place (the file is rewritten atomically). Returns what was written."""
        clean: dict[str, Any] = scrub_secrets(entry, self.secrets() | set(secrets))
        clean["key"] = entry["key"]
        line = _dump_json_line(clean)
        with self._file_lock():
            self._stamp = None
            self._refresh()
            if clean["key"] in self._entries:
                self._rewrite(replace=clean)
            else:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            self._stamp = None
        return clean

    def _rewrite(self, replace: dict[str, Any] | None = None) -> None:
        """Write the file again: one line per key (at its first position), atomically."""
        ordered: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            with open(self.path, "rb") as fh:
                for raw in fh:
                    try:
                        entry = json.loads(raw)
                        key = entry["key"]
                    except (ValueError, KeyError, TypeError):
                        continue
                    ordered[key] = entry
        if replace is not None:
            ordered[replace["key"]] = replace
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp",
                                   dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                for entry in ordered.values():
                    fh.write(_dump_json_line(entry))
                fh.flush()
                os.fsync(fh.fileno())
            if self.path.exists():
                os.chmod(tmp, self.path.stat().st_mode & 0o777)
            else:
                os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def compact(self) -> int:
        """Drop duplicate and unreadable lines (a key keeps its first position and its last
        content); returns how many entries remain."""
        with self._file_lock():
            if self.path.exists():
                self._rewrite()
            self._stamp = None
            self._refresh()
            return len(self._entries)

    # -- entries ---------------------------------------------------------------------------------
    def record(
        self,
        key: str,
        *,
        provider: str,
        model: str,
        request: ChatRequest,
        deltas: list[tuple[float, StreamDelta]],
        response: Response,
        streamed: bool,
        label: str | None = None,
        secrets: Iterable[str] = (),
    ) -> dict[str, Any]:
        """Store one answer (see the module docstring for the line's fields)."""
        entry: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "key": key,
            "provider": provider,
            "model": model,
            "created": _now(),
            "label": label,
            "request": {
                "messages": len(request.messages),
                "last_user": _preview(_last_user_text(request)),
            },
            "streamed": streamed,
            "deltas": [
                {"t": round(max(t, 0.0), 3), **d.model_dump(mode="json", exclude_none=True)}
                for t, d in deltas
            ],
            "response": response.model_dump(mode="json", exclude_none=True),
        }
        if label is None:
            del entry["label"]
        return self.put(entry, secrets=secrets)


def _entry_deltas(entry: dict[str, Any]) -> list[tuple[float, StreamDelta]]:
    out: list[tuple[float, StreamDelta]] = []
    for raw in entry.get("deltas") or ():
        data = dict(raw)
        t = float(data.pop("t", 0.0))
        out.append((t, StreamDelta.model_validate(data)))
    return out


def deltas_for(response: Response) -> list[StreamDelta]:
    """The deltas a stream of ``response`` would have produced (for answers recorded unstreamed)."""
    out: list[StreamDelta] = []
    for block in response.content:
        if isinstance(block, TextBlock) and block.text:
            out.append(StreamDelta(type="text_delta", text=block.text))
        elif isinstance(block, ThinkingBlock) and block.thinking:
            out.append(StreamDelta(type="thinking_delta", text=block.thinking))
        elif isinstance(block, ToolUseBlock):
            out.append(StreamDelta(type="tool_use_start", tool_call_id=block.id,
                                   tool_name=block.name))
            raw = block.raw_arguments if block.arguments_error else json.dumps(block.arguments)
            if raw:
                out.append(StreamDelta(type="tool_use_delta", tool_call_id=block.id,
                                       tool_name=block.name, argument_delta=raw))
            out.append(StreamDelta(type="tool_use_end", tool_call_id=block.id,
                                   tool_name=block.name, arguments=block.arguments))
    return out


# -- streams built from elsewhere -----------------------------------------------------------------
class _ForeignAccumulator(Accumulator):
    """An accumulator whose answer comes from elsewhere: ``partial`` and ``final`` callables."""

    def __init__(self, model: str, partial: Callable[[], Response],
                 final: Callable[[], Response]) -> None:
        super().__init__(model)
        self._partial = partial
        self._final = final

    def snapshot(self) -> Response:
        return self._partial()

    def finish(self) -> Response:
        return self._final()


def _feed(acc: Accumulator, delta: StreamDelta) -> None:
    """Rebuild the partial answer of a replay from its deltas."""
    if delta.type == "text_delta":
        acc.text(delta.text or "")
    elif delta.type == "thinking_delta":
        acc.thinking(delta.text or "")
    elif delta.type == "tool_use_start":
        key = delta.tool_call_id or ""
        acc.tool_start(key, key, delta.tool_name or "")
    elif delta.type == "tool_use_delta":
        key = delta.tool_call_id or ""
        if acc.has_tool(key):
            acc.tool_delta(key, delta.argument_delta or "")
    elif delta.type == "tool_use_end":
        key = delta.tool_call_id or ""
        if acc.has_tool(key):
            acc.tool_end(key, arguments=delta.arguments)


# -- the adapter wrapper --------------------------------------------------------------------------
class CachedAdapter(Adapter):
    """``adapter`` behind a :class:`ResponseCache`: ``chat``/``stream``/``achat``/``astream``
    replay, record or pass through according to the cache's mode, with the usual stream
    semantics (deltas, ``.response``, ``partial``, ``close()``, ``timeout``, ``cancel``).

    ``cache`` is a :class:`ResponseCache` or a path; without one, a cache is made from ``path``,
    ``mode`` and ``pace``. ``label`` (e.g. ``"cell 3"``) is stored with recorded answers and
    named by :class:`CacheMissError`; :meth:`with_label` gives a labelled twin. ``replayed_calls``
    and ``model_calls`` count the calls this instance answered from the cache and from the model
    (a :meth:`with_label` twin starts at zero), so a caller can tell a replayed answer from a
    fresh one. Everything else
    (identity, ``list_models``, ``count_tokens``, ``validate``, attributes) is the wrapped
    adapter's.
    """

    def __init__(
        self,
        adapter: Adapter,
        cache: ResponseCache | str | os.PathLike[str] | None = None,
        *,
        mode: str | None = None,
        path: str | os.PathLike[str] | None = None,
        pace: Literal["instant", "recorded"] = "instant",
        label: str | None = None,
    ) -> None:
        super().__init__(max_tokens=adapter.default_max_tokens, timeout=adapter.default_timeout,
                         max_retries=adapter.max_retries)
        if isinstance(cache, ResponseCache):
            if mode is not None or path is not None:
                raise ValueError("pass mode and path to the ResponseCache, not to CachedAdapter")
            self.cache = cache
        else:
            if cache is not None and path is not None:
                raise ValueError("give the cache file once: as cache or as path")
            self.cache = ResponseCache(cache if cache is not None else path, mode, pace=pace)
        #: the adapter that answers when the cache does not
        self.inner = adapter
        #: names recorded answers and cache misses (e.g. "cell 3")
        self.label = label
        self.provider_options = adapter.provider_options
        self.backend_mode = adapter.backend_mode
        #: calls this instance answered from the cache (replayed, nothing sent)
        self.replayed_calls = 0
        #: calls this instance passed to the wrapped adapter (the model answered)
        self.model_calls = 0

    def with_label(self, label: str | None) -> CachedAdapter:
        """The same adapter and cache, with another label."""
        return CachedAdapter(self.inner, self.cache, label=label)

    # -- identity: the wrapped adapter's ---------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.inner.model_name

    @property
    def provider_name(self) -> str:
        return self.inner.provider_name

    @property
    def display_name(self) -> str:
        return self.inner.display_name

    @property
    def max_context_tokens(self) -> int | None:
        return self.inner.max_context_tokens

    def list_models(self) -> list[ModelInfo]:
        return self.inner.list_models()

    async def alist_models(self) -> list[ModelInfo]:
        return await self.inner.alist_models()

    def count_tokens(self, messages: Any, system: str | None = None,
                     tools: Iterable[Any] | None = None) -> int:
        return self.inner.count_tokens(messages, system=system, tools=tools)

    def validate(self) -> ValidationResult:
        return self.inner.validate()

    def output_mode(self, request: ChatRequest) -> str | None:
        return self.inner.output_mode(request)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    def __repr__(self) -> str:
        return f"CachedAdapter({self.inner!r}, {self.cache!r}, label={self.label!r})"

    # -- plumbing ----------------------------------------------------------------------------------
    def _lookup(self, request: ChatRequest) -> tuple[str, dict[str, Any] | None]:
        key = cache_key(self.inner.provider_name, self.inner.model_name, request)
        entry = self.cache.get(key) if self.cache.reads else None
        if entry is None and self.cache.mode == "replay":
            raise self._miss(key, request)
        return key, entry

    def _miss(self, key: str, request: ChatRequest) -> CacheMissError:
        what = self.label or "this prompt"
        preview = _preview(_last_user_text(request))
        short = preview if len(preview) <= 60 else preview[:59] + "…"
        return CacheMissError(
            f"no recorded answer for {what} ({short!r}, {self.inner.provider_name}:"
            f"{self.inner.model_name}) in {self.cache.path}; the cache is in replay mode and "
            "sends nothing to the model. Record it once with --cache record "
            "(or DISPATCH_NB_CACHE=record), or use --cache read-write to record only what is "
            "missing. (A changed prompt, model, system prompt or option is a different request.)",
            provider=self.inner.provider_name, key=key, label=self.label, path=self.cache.path,
        )

    def _store(self, key: str, request: ChatRequest, deltas: list[tuple[float, StreamDelta]],
               response: Response, streamed: bool) -> None:
        if not self.cache.writes:
            return
        try:
            self.cache.record(
                key, provider=self.inner.provider_name, model=self.inner.model_name,
                request=request, deltas=deltas, response=response, streamed=streamed,
                label=self.label, secrets=_adapter_secrets(self.inner),
            )
        except OSError as exc:
            log.warning("could not record the answer in %s: %s", self.cache.path, exc)

    # -- the seams of Adapter: normalization is the wrapped adapter's, a call is a cache lookup ---
    def _request(self, messages: Any, *, system: str | None, tools: Iterable[Any] | None,
                 stream: bool, max_tokens: int | None, temperature: float | None,
                 options: dict[str, Any]) -> ChatRequest:
        return self.inner._request(
            messages, system=system, tools=tools, stream=stream, max_tokens=max_tokens,
            temperature=temperature, options=options,
        )

    def _open(self, request: ChatRequest, timeout: float | None,
              cancel: CancelToken | None) -> ResponseStream:
        """The answer as a stream: replayed, or from the model (recorded when the mode writes)."""
        if self.cache.mode == "off":
            self.model_calls += 1
            return self.inner._open(request, timeout, cancel)
        key, entry = self._lookup(request)
        if entry is not None:
            self.replayed_calls += 1
            return self._replay(entry, request.stream, timeout, cancel)
        self.model_calls += 1
        return self._recording(key, request, self.inner._open(request, timeout, cancel))

    def _aopen(self, request: ChatRequest, timeout: float | None,
               cancel: CancelToken | None) -> AsyncResponseStream:
        """The async twin of :meth:`_open`."""
        if self.cache.mode == "off":
            self.model_calls += 1
            return self.inner._aopen(request, timeout, cancel)
        key, entry = self._lookup(request)
        if entry is not None:
            self.replayed_calls += 1
            return self._areplay(entry, request.stream, timeout, cancel)
        self.model_calls += 1
        return self._arecording(key, request, self.inner._aopen(request, timeout, cancel))

    # -- replaying and recording ----------------------------------------------------------------
    @staticmethod
    def _replay_parts(
        entry: dict[str, Any],
    ) -> tuple[list[tuple[float, StreamDelta]], _ForeignAccumulator, Accumulator]:
        """The recorded deltas, the stream's accumulator (ending in the recorded response) and
        the accumulator that rebuilds the partial answer as deltas are replayed."""
        deltas = _entry_deltas(entry)
        final = Response.model_validate(entry["response"])
        partial = Accumulator(final.model)
        acc = _ForeignAccumulator(final.model, partial.snapshot,
                                  lambda: final.model_copy(deep=True))
        return deltas, acc, partial

    def _replay(self, entry: dict[str, Any], streamed: bool, timeout: float | None,
                cancel: CancelToken | None) -> ResponseStream:
        """Replay ``entry``; an unstreamed call takes as long but yields no deltas."""
        deltas, acc, partial = self._replay_parts(entry)
        control = self.inner._control(timeout, cancel)
        paced = self.cache.pace == "recorded"

        def run() -> Iterator[StreamDelta]:
            control.start()
            began = time.monotonic()
            try:
                for t, delta in deltas:
                    if paced:
                        wait = t - (time.monotonic() - began)
                        if wait > 0:
                            control.sleep(wait)
                    control.check()
                    _feed(partial, delta)
                    if streamed:
                        yield delta
                control.check()
            finally:
                control.stop()

        return ResponseStream(run(), acc)

    def _areplay(self, entry: dict[str, Any], streamed: bool, timeout: float | None,
                 cancel: CancelToken | None) -> AsyncResponseStream:
        """The async twin of :meth:`_replay`."""
        deltas, acc, partial = self._replay_parts(entry)
        control = self.inner._control(timeout, cancel)
        paced = self.cache.pace == "recorded"

        async def run() -> AsyncIterator[StreamDelta]:
            control.start_async(asyncio.get_running_loop())
            began = time.monotonic()
            try:
                for t, delta in deltas:
                    if paced:
                        wait = t - (time.monotonic() - began)
                        if wait > 0:
                            await control.asleep(wait)
                    control.check()
                    _feed(partial, delta)
                    if streamed:
                        yield delta
                control.check()
            finally:
                control.stop()

        return AsyncResponseStream(run(), acc)

    def _store_answer(self, key: str, request: ChatRequest, began: float,
                      seen: list[tuple[float, StreamDelta]], response: Response) -> None:
        """Record a finished call: its deltas as they streamed, or for an unstreamed call the
        deltas the response would have streamed, all at the time it arrived."""
        if not request.stream:
            elapsed = time.monotonic() - began
            seen = [(elapsed, d) for d in deltas_for(response)]
        self._store(key, request, seen, response, streamed=request.stream)

    def _recording(self, key: str, request: ChatRequest, inner: ResponseStream) -> ResponseStream:
        began = time.monotonic()
        seen: list[tuple[float, StreamDelta]] = []

        def run() -> Iterator[StreamDelta]:
            try:
                for delta in inner:
                    seen.append((time.monotonic() - began, delta))
                    yield delta
                response = inner.response
            finally:
                inner.close()
            self._store_answer(key, request, began, seen, response)

        acc = _ForeignAccumulator(self.inner.model_name, lambda: inner.partial,
                                  lambda: inner.response)
        return ResponseStream(run(), acc)

    def _arecording(self, key: str, request: ChatRequest,
                    inner: AsyncResponseStream) -> AsyncResponseStream:
        began = time.monotonic()
        seen: list[tuple[float, StreamDelta]] = []

        async def run() -> AsyncIterator[StreamDelta]:
            try:
                async for delta in inner:
                    seen.append((time.monotonic() - began, delta))
                    yield delta
                response = inner.response
            finally:
                await inner.aclose()
            self._store_answer(key, request, began, seen, response)

        acc = _ForeignAccumulator(self.inner.model_name, lambda: inner.partial,
                                  lambda: inner.response)
        return AsyncResponseStream(run(), acc)
