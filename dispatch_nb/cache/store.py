"""The cache file: :class:`ResponseCache` reads, appends and rewrites one JSON-lines file of recorded
answers (docs/record-replay.md, "The file"); :func:`resolve_cache_mode` and
:func:`default_cache_path` say how and where.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from ..errors import RequestError
from ..types import Message, Response, StreamDelta
from ..wire.request import ChatRequest
from .keys import FORMAT_VERSION, scrub_secrets, secret_env_names

try:  # POSIX; elsewhere the in-process lock alone guards writes
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CACHE_MODES",
    "CACHE_SUFFIX",
    "CacheMissError",
    "CacheMode",
    "ResponseCache",
    "default_cache_path",
    "resolve_cache_mode",
]

log = logging.getLogger("dispatch_nb")

CacheMode = Literal["off", "read-write", "replay", "record"]
#: every mode, in the order the docs list them
CACHE_MODES: tuple[str, ...] = get_args(CacheMode)
#: the file-name suffix of a notebook's cache file
CACHE_SUFFIX = ".dispatch-cache.jsonl"
#: a line's fingerprint of its last user message
_FINGERPRINT = "last_user_sha256"


class CacheMissError(RequestError):
    """Replay mode found no recorded answer for this request. The message names the cell (its
    ``label``) or the prompt, the cache file, and how to record it."""

    default_code = "cache_miss"

    def __init__(self, message: str, *, key: str = "", label: str | None = None,
                 path: Path | None = None, earlier: int | None = None,
                 recorded_earlier: tuple[int, ...] = (), spacing: bool = False,
                 unavailable: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        #: the cache key that was looked up
        self.key = key
        #: the caller's label (e.g. "cell 3"), if any
        self.label = label
        #: the cache file
        self.path = path
        #: how many messages came before this request's last user message
        self.earlier = earlier
        #: for each answer recorded for the same last user message and model (a request that
        #: differs in the conversation before it, the system prompt, tools or options): how many
        #: messages came before it; empty when that message was never recorded for this model
        self.recorded_earlier = recorded_earlier
        #: True when no such answer is recorded but one for a last user message that differs
        #: from this one only in spaces and line breaks is
        self.spacing = spacing
        #: why the model cannot answer here (replay stands in for it: its extra is not installed,
        #: its model file or base URL is missing), so asking it is no fix; None when it can
        self.unavailable = unavailable


# -- modes and paths ------------------------------------------------------------------------------
def resolve_cache_mode(mode: str | None = None) -> CacheMode:
    """``mode``, else ``$DISPATCH_NB_CACHE``, else ``off``; checked against :data:`CACHE_MODES`."""
    value = (mode if mode is not None else os.environ.get("DISPATCH_NB_CACHE", "")).strip().lower() or "off"
    if value not in CACHE_MODES:
        import difflib

        close = difflib.get_close_matches(value, CACHE_MODES, n=1)
        raise ValueError(
            f"{'mode' if mode is not None else 'DISPATCH_NB_CACHE'}={value!r} is not a cache mode"
            f"{f' (did you mean {close[0]}?)' if close else ''}; use one of {', '.join(CACHE_MODES)}"
        )
    return value  # type: ignore[return-value]


def default_cache_path(env: dict[str, str] | None = None) -> Path:
    """Where a notebook's answers are kept: ``$DISPATCH_NB_CACHE_FILE``, else beside the notebook
    ``$JPY_SESSION_NAME`` names (jupyter-server 2 sets it), else ``dispatch-cache.jsonl`` here."""
    env = dict(os.environ) if env is None else env
    explicit = env.get("DISPATCH_NB_CACHE_FILE", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    session = env.get("JPY_SESSION_NAME", "").strip()
    if session.endswith(".ipynb"):
        notebook = Path(session)
        return notebook.with_name(notebook.stem + CACHE_SUFFIX)
    return Path("dispatch-cache.jsonl")


# -- the file -------------------------------------------------------------------------------------
#: one lock per file (``dict.setdefault`` is atomic: every thread gets the same one)
_path_locks: dict[str, threading.Lock] = {}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _preview(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _last_user_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            text = message.text
            if text:
                return text
            kinds = sorted({b.type for b in message.blocks})
            return f"({', '.join(kinds)})"
    return ""


def _fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _dump_json_line(entry: dict[str, Any]) -> bytes:
    return (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


class ResponseCache:
    """One JSON-lines file of recorded answers, and the mode it is used in (``mode``, ``pace``,
    ``secrets``: docs/record-replay.md). Safe to share between threads and processes."""

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
        self._lock = _path_locks.setdefault(str(self.path.resolve()), threading.Lock())
        self._entries: dict[str, dict[str, Any]] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._read: tuple[int, int, int] = (0, 0, 0)  # (inode, bytes, lines) already in _entries

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
        from_env = (os.environ.get(name, "").strip() for name in secret_env_names())
        return self._secrets | {value for value in from_env if value}

    # -- reading ---------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Read what the file gained since the last look: only the lines appended since, unless
        the file was replaced or shrank (then all of it), so appending N answers reads each
        line once, not the whole file N times."""
        try:
            st = self.path.stat()
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return
        inode, offset, number = self._read
        if stamp is None or stamp[0] != inode or stamp[1] < offset:
            self._entries, inode, offset, number = {}, stamp[0] if stamp else 0, 0, 0
        if stamp is not None:
            with open(self.path, "rb") as fh:
                fh.seek(offset)
                for raw in fh:
                    if not raw.endswith(b"\n"):  # maybe still being written: read again next time
                        self._add(raw, number + 1, quiet=True)
                        break
                    number += 1
                    offset += len(raw)
                    self._add(raw, number)
        self._read = (inode, offset, number)
        self._stamp = stamp

    def _add(self, raw: bytes, number: int, quiet: bool = False) -> None:
        if not raw.strip():
            return
        try:
            entry = json.loads(raw)
            key = entry["key"]
            if not isinstance(key, str) or not isinstance(entry.get("response",
                                                                     entry.get("job")), dict):
                raise TypeError("not an entry")  # an answer, or a batch checkpoint's job
        except (ValueError, KeyError, TypeError):
            if not quiet:
                log.warning("%s line %d is not a cache entry; ignoring it", self.path, number)
            return
        self._entries[key] = entry  # the last line with a key wins

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

    def same_prompt(self, provider: str, model: str, messages: list[Message], *,
                    spacing: bool = False) -> list[dict[str, Any]]:
        """The entries recorded for ``provider``/``model`` whose last user message is that of
        ``messages`` (by the line's fingerprint; a line written before fingerprints, by its
        preview: the same up to spaces and line breaks): after a miss, the same prompt recorded
        in another request — another conversation before it, system prompt, tools or option.
        With ``spacing``, instead those whose message differs from it only in spaces and line
        breaks (fingerprinted lines)."""
        text = _last_user_text(messages)
        fingerprint, whole = _fingerprint(text), " ".join(text.split())
        # the preview tells only a message it keeps whole and unscrubbed
        known = scrub_secrets(_preview(text), self.secrets()) == whole

        def matches(request: dict[str, Any]) -> bool:
            recorded = request.get(_FINGERPRINT)
            if spacing:
                return known and recorded not in (None, fingerprint) and request.get("last_user") == whole
            return recorded == fingerprint if recorded else known and request.get("last_user") == whole

        return [e for e in self.entries()
                if e.get("provider") == provider and e.get("model") == model
                and isinstance(e.get("request"), dict) and matches(e["request"])]

    def qualify(self, spec: str, default: str | None = None) -> str:
        """``spec`` as ``"provider:model"`` for calls through this cache. In ``replay`` mode a
        bare model name is the provider's that recorded it here, when one did (a notebook recorded
        through GitHub Copilot replays as Copilot's where nobody is logged in), else it resolves
        as :func:`~dispatch_nb.registry.parse_model_spec` says without credentials (a replay
        sends nothing); in the other modes, as it says with them."""
        from ..registry import find_descriptor, qualify_model_spec

        name = spec.strip() if isinstance(spec, str) else spec
        head, sep, _ = name.partition(":") if isinstance(name, str) else ("", "", "")
        if self.mode == "replay" and name and not (sep and find_descriptor(head) is not None):
            recorded = {e.get("provider") for e in self.entries() if e.get("model") == name}
            if len(recorded) == 1 and find_descriptor(provider := str(recorded.pop())):
                return f"{provider}:{name}"
        return qualify_model_spec(spec, default, sends=self.mode != "replay")

    # -- writing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """The in-process lock plus an exclusive flock on the file's directory (other processes)."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # The lock is on the directory: the cache file itself is replaced by rewrites, and a
            # lock file beside a notebook would clutter the repository.
            try:
                fd = os.open(self.path.parent, os.O_RDONLY) if fcntl is not None else -1
            except OSError:
                fd = -1
            if fd < 0:
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
                self._entries[clean["key"]] = clean
                self._rewrite()
            else:
                with open(self.path, "ab", opener=lambda p, flags: os.open(p, flags, 0o644)) as fh:
                    fh.write(line)
            self._stamp = None
        return clean

    def _rewrite(self) -> None:
        """Write the file again from the entries read: one line per key (at its first position,
        with its last content), atomically."""
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp",
                                   dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                for entry in self._entries.values():
                    fh.write(_dump_json_line(entry))
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, self.path.stat().st_mode & 0o777 if self.path.exists() else 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def compact(self) -> int:
        """Drop duplicate and unreadable lines (a key keeps its first position and its last
        content); returns how many entries remain."""
        with self._file_lock():
            self._stamp = None
            self._refresh()
            if self.path.exists():
                self._rewrite()
            return len(self._entries)

    # -- entries ---------------------------------------------------------------------------------
    def record(
        self,
        key: str,
        *,
        provider: str,
        model: str,
        request: ChatRequest,
        response: Response,
        streamed: bool,
        deltas: list[tuple[float, StreamDelta]] | None = None,
        label: str | None = None,
        secrets: Iterable[str] = (),
        **facts: Any,
    ) -> dict[str, Any]:
        """Store one answer (its line: docs/record-replay.md, "The file"), with ``facts`` after
        it (a batch checkpoint's row facts, which keeps no deltas). Of the request it keeps how
        many messages, the last user message's start (for reviewers; the prompt itself lives in
        the notebook) and its fingerprint (after a miss: is this very message recorded?)."""
        text = _last_user_text(request.messages)
        entry: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "key": key,
            "provider": provider,
            "model": model,
            "created": _now(),
            **({"label": label} if label is not None else {}),
            "request": {"messages": len(request.messages), "last_user": _preview(text),
                        _FINGERPRINT: _fingerprint(text)},
            "streamed": streamed,
        }
        if deltas is not None:
            entry["deltas"] = [
                {"t": round(max(t, 0.0), 3), **d.model_dump(mode="json", exclude_none=True)}
                for t, d in deltas
            ]
        entry["response"] = response.model_dump(mode="json", exclude_none=True)
        return self.put({**entry, **facts}, secrets=secrets)


def _entry_deltas(entry: dict[str, Any]) -> list[tuple[float, StreamDelta]]:
    return [(float(raw.get("t", 0.0)),
             StreamDelta.model_validate({k: v for k, v in raw.items() if k != "t"}))
            for raw in entry.get("deltas") or ()]

