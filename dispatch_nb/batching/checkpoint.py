"""A batch's checkpoint: a :class:`~dispatch_nb.cache.ResponseCache` whose keys are the rows, and
which also records a deferred batch's provider jobs (docs/batch.md, "Resuming: the checkpoint"
and "Deferred").
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..adapter import Adapter
from ..cache import ResponseCache
from ..cache.keys import FORMAT_VERSION
from ..cache.store import _now
from ..types import Message, Response, Usage, as_messages
from ..wire.request import ChatRequest

__all__ = ["Checkpoint", "shared_checkpoint"]


class Checkpoint:
    """The checkpoint at ``path``: a response cache in ``read-write`` mode (``cache``: one made
    already, e.g. :func:`shared_checkpoint`'s)."""

    def __init__(self, path: str | os.PathLike[str], cache: ResponseCache | None = None) -> None:
        self.path = Path(path).expanduser().absolute()
        if self.path.is_dir():
            raise ValueError(f"checkpoint={str(path)!r} is a directory; name a file, e.g. run.jsonl")
        #: the store
        self.cache = cache if cache is not None else ResponseCache(self.path, mode="read-write")
        #: the keys of the rows whose answers this object read (:meth:`answer`)
        self.read: set[str] = set()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r})"

    def answer(self, key: str) -> tuple[Response, Usage, float] | None:
        """The recorded answer of the row keyed ``key`` (response, usage, latency), or None."""
        entry = self.cache.get(key)
        if entry is None:
            return None
        self.read.add(key)
        response = Response.model_validate(entry["response"])
        usage = Usage.model_validate(entry.get("usage") or response.usage.model_dump())
        return response, usage, float(entry.get("latency") or 0.0)

    def record(self, key: str, position: int, messages: str | list[Message], response: Response,
               adapter: Adapter, *, streamed: bool, usage: Usage, latency: float,
               attempts: int) -> None:
        """Write one answered row (``adapter``: the one that answered it)."""
        self.cache.record(key, provider=adapter.provider_name, model=adapter.model_name,
                          request=ChatRequest(as_messages(messages)),
                          response=response, streamed=streamed, label=f"row {position}",
                          row=position, latency=round(latency, 3), attempts=attempts,
                          usage=usage.model_dump(mode="json"))

    # -- provider jobs (batch(..., deferred=True)) ----------------------------------------------
    def jobs(self, *, collected: bool = False) -> Iterator[tuple[dict[str, Any], list[str]]]:
        """The provider jobs recorded here whose answers are not all collected yet (or, with
        ``collected=True``, the collected ones), oldest first: each job's state and the keys of
        its rows."""
        for entry in self.cache.entries():
            if isinstance(entry.get("job"), dict) and collected == bool(entry.get("collected")):
                yield entry["job"], [k for k in entry.get("keys") or [] if isinstance(k, str)]

    def record_job(self, job: dict[str, Any], keys: list[str], *, collected: bool = False) -> None:
        """Record a provider job: its state and the keys of the rows it holds."""
        self.cache.put({"v": FORMAT_VERSION, "key": f"job:{job['id']}", "created": _now(),
                        "job": job, "keys": keys, "collected": collected})


@functools.lru_cache(maxsize=16)
def _cache(path: str) -> ResponseCache:
    return ResponseCache(path, mode="read-write")


def shared_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint at ``path`` over this process's one cache of it, so that each Dask partition
    a worker runs reads only what was appended since the last one did."""
    return Checkpoint(path, cache=_cache(str(Path(path).expanduser().absolute())))
