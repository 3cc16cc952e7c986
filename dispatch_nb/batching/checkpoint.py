"""A batch's checkpoint: one JSON line per finished row, written the moment the row finishes.

::

    {"key":"3f9c…","v":1,"row":17,"ok":true,"created":"2026-…Z","latency":1.204,"attempts":1,
     "usage":{…},"response":{…the Response as JSON…}}
    {"key":"a71e…","v":1,"row":18,"ok":false,"created":"…","latency":30.0,"attempts":3,
     "usage":{…},"error":{"type":"RateLimitError","message":"…","status_code":429,"code":"rate_limited"}}

``key`` is what was asked (:func:`~dispatch_nb.batching.rows.row_key`: the model, the filled prompt
and the request options), so a rerun — the same rows, more rows, or the rows in another order —
finds every answered row and sends only the others. A row that failed is written too (so the file
says why) but counts as not answered: the next run sends it again. Cancelled rows are not written.

Each line is appended with one ``write`` under an exclusive ``flock`` (several processes — Dask
workers on one machine or a shared filesystem — may append to one file), so a killed kernel or
worker loses at most the rows that were in flight; a line cut short by a crash is skipped on the
next read. Secrets are scrubbed as in the response cache.

A batch sent to a provider's batch API (``deferred=True``) also writes one line per provider job
the moment it is created, and again when its answers are collected::

    {"job":"batch_68…","v":1,"created":"…","part":{"id":"batch_68…","state":"in_progress",…},
     "keys":["3f9c…","a71e…",…],"collected":false}
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..cache import ResponseCache, scrub_secrets
from ..errors import DispatchError
from ..types import Response, Usage

try:  # POSIX; elsewhere one process writes at a time anyway
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["Checkpoint"]

log = logging.getLogger("dispatch_nb")

FORMAT_VERSION = 1
_KEY = re.compile(rb'^\{"key":"([^"]+)"')


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace(
        "+00:00", "Z"
    )


class Checkpoint:
    """The JSON-lines file at ``path`` (created on the first finished row)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser().absolute()
        if self.path.is_dir():
            raise ValueError(f"checkpoint={str(path)!r} is a directory; name a file, e.g. run.jsonl")
        self._answered: dict[str, dict[str, Any]] = {}
        self._jobs: dict[str, dict[str, Any]] = {}
        self._fd: int | None = None
        # the usual key variables' values (OPENAI_API_KEY...), as the response cache scrubs them
        self._secrets: set[str] = ResponseCache(self.path, mode="off").secrets()
        #: rows this object wrote
        self.written = 0

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, answered={len(self._answered)})"

    def add_secret(self, value: str) -> None:
        """Never write ``value``."""
        if value:
            self._secrets.add(value)

    # -- reading ---------------------------------------------------------------------------------
    def load(self, only: set[str] | None = None) -> int:
        """Read the answered rows (all, or only the keys in ``only``); returns how many."""
        answered: dict[str, dict[str, Any]] = {}
        jobs: dict[str, dict[str, Any]] = {}
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            self._answered, self._jobs = answered, jobs
            return 0
        with fh:
            for number, raw in enumerate(fh, 1):
                if only is not None:
                    match = _KEY.match(raw)
                    if match is not None and match.group(1).decode("ascii", "replace") not in only:
                        continue
                try:
                    entry = json.loads(raw)
                    if isinstance(entry, dict) and "job" in entry:
                        jobs[str(entry["job"])] = entry  # a provider job (a later line wins)
                        continue
                    key = entry["key"]
                    ok = entry["ok"]
                except (ValueError, KeyError, TypeError):
                    if raw.strip():
                        log.warning("%s line %d is not a checkpoint entry (cut short by a crash?); "
                                    "ignoring it", self.path, number)
                    continue
                if only is not None and key not in only:
                    continue
                if ok is True and isinstance(entry.get("response"), dict):
                    answered[key] = entry
        self._answered, self._jobs = answered, jobs
        return len(answered)

    def __len__(self) -> int:
        return len(self._answered)

    def __contains__(self, key: object) -> bool:
        return key in self._answered

    def answer(self, key: str) -> tuple[Response, Usage, float] | None:
        """The recorded answer for ``key`` (response, usage, latency), or None."""
        entry = self._answered.get(key)
        if entry is None:
            return None
        response = Response.model_validate(entry["response"])
        usage = Usage.model_validate(entry.get("usage") or response.usage.model_dump())
        return response, usage, float(entry.get("latency") or 0.0)

    # -- writing ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fd = self._fd
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield fd
        finally:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def record(
        self,
        key: str,
        position: int,
        item: Response | DispatchError,
        *,
        usage: Usage,
        latency: float,
        attempts: int,
    ) -> None:
        """Append one finished row (a ``Response``, or the ``DispatchError`` it ended with)."""
        entry: dict[str, Any] = {
            "key": key,
            "v": FORMAT_VERSION,
            "row": position,
            "ok": isinstance(item, Response),
            "created": _now(),
            "latency": round(latency, 3),
            "attempts": attempts,
            "usage": usage.model_dump(mode="json"),
        }
        if isinstance(item, Response):
            entry["response"] = item.model_dump(mode="json", exclude_none=True)
        else:
            entry["error"] = {
                "type": type(item).__name__,
                "message": item.message,
                "status_code": item.status_code,
                "code": item.code,
            }
        clean = scrub_secrets(entry, self._secrets)
        clean["key"] = key
        line = (json.dumps(clean, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        with self._locked() as fd:
            os.write(fd, line)
        self.written += 1
        if clean["ok"]:
            self._answered[key] = clean

    # -- provider jobs (batch(..., deferred=True)) ------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """The provider jobs recorded here whose answers are not all collected yet: each
        ``{"job": id, "part": {...}, "keys": [...]}``, oldest first."""
        return [entry for entry in self._jobs.values() if not entry.get("collected")]

    def record_job(self, part: dict[str, Any], keys: list[str], *, collected: bool = False) -> None:
        """Append a provider job: its state (``part``) and the row keys it holds — written
        before the job is polled, so a rerun (another kernel, another machine with this file)
        collects it instead of submitting the rows again."""
        entry = {"job": part["id"], "v": FORMAT_VERSION, "created": _now(), "part": part,
                 "keys": keys, "collected": collected}
        line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        with self._locked() as fd:
            os.write(fd, line)
        self._jobs[str(part["id"])] = entry

    def close(self) -> None:
        """Close the file (idempotent; :meth:`record` reopens it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
