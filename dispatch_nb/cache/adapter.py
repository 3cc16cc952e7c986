"""The adapter wrapper: :class:`CachedAdapter` answers from a :class:`~dispatch_nb.cache.ResponseCache`,
replaying a recorded answer as a stream (docs/record-replay.md, "Replay").
"""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any, Literal

from ..adapter import Adapter, ChatRequest
from ..cancel import CancelToken
from ..cost import ledger
from ..render import mark_replayed, name_spec
from ..stream import Accumulator, AsyncResponseStream, ResponseStream, _Mirror, sync_stream
from ..types import Response, StreamDelta
from .keys import _adapter_secrets, cache_key
from .store import (
    _FINGERPRINT,
    CacheMissError,
    ResponseCache,
    _entry_deltas,
    _last_user_text,
    _preview,
)

__all__ = ["CachedAdapter"]

log = logging.getLogger("dispatch_nb")


def _earlier_counts(entries: Iterable[dict[str, Any]]) -> tuple[int, ...]:
    """How many messages came before the last one in each entry's request."""
    return tuple(sorted({n - 1 for e in entries
                         if isinstance(n := e["request"].get("messages"), int) and n > 0}))


def _count(numbers: Iterable[int]) -> str:
    """``(0,)`` → "no earlier message", ``(1, 3)`` → "1 or 3 earlier messages"."""
    values = sorted(numbers)
    if values == [0]:
        return "no earlier message"
    words = " or ".join(str(n) for n in values)
    return f"{words} earlier message{'' if values == [1] else 's'}"


class _Replayed(Accumulator):
    """A replay's accumulator: fed the recorded deltas as they are replayed (``partial``), it
    finishes with the recorded response itself."""

    def __init__(self, final: Response, adapter: Adapter) -> None:
        super().__init__(final.model, adapter.spec)
        self._final = final
        self._adapter = adapter  # the wrapped one: the ledger's provider and model

    def finish(self) -> Response:
        """The recorded answer; its cost is the recorded one, marked replayed (nothing is spent
        now), and entered in the ledger as saved; its footer says "replayed", as a %%chat
        cell's does."""
        final = self._final.model_copy(deep=True)
        if final.cost is not None:
            final.cost = final.cost.model_copy(update={"replayed": True})
        ledger.record(self._adapter.provider_name, self._adapter.model_name, final.usage, final.cost,
                      replayed=True)
        mark_replayed(final)
        name_spec(final, self.spec)
        return final


class CachedAdapter(Adapter):
    """``adapter`` behind a :class:`ResponseCache` (or a path; without one, a cache made from
    ``path``, ``mode`` and ``pace``): every call replays, records or passes through according to
    the cache's mode. Everything but the calls (identity, ``list_models``, ``count_tokens``,
    attributes) is the wrapped adapter's (docs/record-replay.md, "From Python")."""

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
        #: calls this instance answered from the cache (replayed, nothing sent)
        self.replayed_calls = 0
        #: calls this instance passed to the wrapped adapter (the model answered)
        self.model_calls = 0

    def with_label(self, label: str | None) -> CachedAdapter:
        """The same adapter and cache, with another label."""
        return CachedAdapter(self.inner, self.cache, label=label)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    def __repr__(self) -> str:
        return f"CachedAdapter({self.inner!r}, {self.cache!r}, label={self.label!r})"

    def _miss(self, key: str, request: ChatRequest) -> CacheMissError:
        what = self.label or "this prompt"
        provider, model = self.inner.provider_name, self.inner.model_name
        short = _preview(_last_user_text(request.messages), 60)
        earlier = max(len(request.messages) - 1, 0)  # as a recorded line counts them
        path = self.cache.path
        if not path.exists():  # not a changed prompt: the recording is elsewhere
            return CacheMissError(
                f"no recorded answer for {what} ({short!r}, {provider}:{model}): the cache file "
                f"{path} does not exist (looked for {path.absolute()}; a relative path is from "
                f"the working directory, {os.getcwd()}). Replay mode sends nothing to the model. "
                "If the answers are recorded elsewhere, point the cache at that file "
                "(ChatMagics.cache_file, DISPATCH_NB_CACHE_FILE or ResponseCache(path)); if "
                "nothing is recorded yet, record with --cache record (or DISPATCH_NB_CACHE="
                "record), which makes the file there.",
                provider=provider, key=key, label=self.label, path=path, earlier=earlier,
            )
        try:
            same = self.cache.same_prompt(provider, model, request.messages)
            recorded = _earlier_counts(e for e in same if _FINGERPRINT in e["request"])
            spacing = not recorded and bool(
                self.cache.same_prompt(provider, model, request.messages, spacing=True))
        except OSError:  # the file went away: the plain miss
            same, recorded, spacing = [], (), False
        if not recorded and not spacing and earlier not in (older := _earlier_counts(same)):
            # lines from before fingerprints know the prompt up to its spacing: they tell only
            # a different conversation before it, which holds whatever the spacing
            recorded = older
        if spacing:
            why = (f"A message to {provider}:{model} that differs from this one only in spaces or "
                   "line breaks is recorded there (they are part of the request): write it as it "
                   "was recorded, or record this one.")
        elif not recorded:
            why = "(A changed prompt, model, system prompt or option is a different request.)"
        elif earlier not in recorded:
            why = (f"The same message to {provider}:{model} is recorded there, but after a "
                   f"different conversation: {_count(recorded)} before it, here "
                   f"{_count((earlier,))} (the earlier turns are part of the request). Send "
                   "the conversation it was recorded with (a notebook: run it from the top in a "
                   "fresh kernel)"
                   + (", or this message alone (a new Session, no history)." if 0 in recorded
                      else ", or record this one."))
        else:
            why = (f"The same message to {provider}:{model} is recorded there, after as many "
                   "messages, but the conversation before it, the system prompt, the tools or an "
                   "option differ (they are part of the request).")
        return CacheMissError(
            f"no recorded answer for {what} ({short!r}, {provider}:{model}) in "
            f"{self.cache.path}; the cache is in replay mode and sends nothing to the model. "
            "Record it once with --cache record (or DISPATCH_NB_CACHE=record), or use --cache "
            f"read-write to record only what is missing. {why}",
            provider=provider, key=key, label=self.label, path=self.cache.path,
            earlier=earlier, recorded_earlier=recorded, spacing=spacing,
            unavailable=self._unavailable(),
        )

    def _unavailable(self) -> str | None:
        """Why the wrapped model cannot answer here (it is a replay's stand-in), else None."""
        from ..replay_only import ReplayOnlyAdapter

        if not isinstance(self.inner, ReplayOnlyAdapter):
            return None
        reason = self.inner.reason
        return str(getattr(reason, "message", None) or reason)

    # -- the seams of Adapter: a call is a cache lookup ------------------------------------------
    def open_stream(self, request: ChatRequest, timeout: float | None,
                    cancel: CancelToken | None) -> ResponseStream:
        """The sync view of :meth:`aopen_stream` (its coroutine on the library's loop thread)."""
        return sync_stream(self.aopen_stream(request, timeout, cancel))

    def aopen_stream(self, request: ChatRequest, timeout: float | None,
                     cancel: CancelToken | None) -> AsyncResponseStream:
        """The answer as a stream: replayed, or from the model (recorded when the mode writes)."""
        if self.cache.mode == "off":
            self.model_calls += 1
            return self.inner.aopen_stream(request, timeout, cancel)
        key = cache_key(self.inner.provider_name, self.inner.model_name, request)
        entry = self.cache.get(key) if self.cache.reads else None
        if entry is None and self.cache.mode == "replay":
            raise self._miss(key, request)
        if entry is not None:
            self.replayed_calls += 1
            return self._areplay(entry, request.stream, timeout, cancel)
        self.model_calls += 1
        return self._arecording(key, request, self.inner.aopen_stream(request, timeout, cancel))

    # -- replaying and recording ----------------------------------------------------------------
    def _areplay(self, entry: dict[str, Any], streamed: bool, timeout: float | None,
                 cancel: CancelToken | None) -> AsyncResponseStream:
        """Replay ``entry``; an unstreamed call takes as long but yields no deltas."""
        deltas = _entry_deltas(entry)
        acc = _Replayed(Response.model_validate(entry["response"]), self.inner)
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
                    acc.feed(delta)
                    if streamed:
                        yield delta
                control.check()
            finally:
                control.stop()

        return AsyncResponseStream(run(), acc)

    def _arecording(self, key: str, request: ChatRequest,
                    inner: AsyncResponseStream) -> AsyncResponseStream:
        """The model's answer, recorded once finished: its deltas as they streamed, or for an
        unstreamed call the deltas the answer would have streamed, all at the time it arrived."""
        began = time.monotonic()
        seen: list[tuple[float, StreamDelta]] = []

        async def run() -> AsyncIterator[StreamDelta]:
            try:
                async for delta in inner:
                    if delta.type != "retry":  # a retry is no part of the answer
                        seen.append((time.monotonic() - began, delta))
                    yield delta
                response = inner.response
            finally:
                await inner.aclose()
            if not request.stream:
                elapsed = time.monotonic() - began
                seen[:] = [(elapsed, d) for d in response.deltas()]
            try:
                self.cache.record(
                    key, provider=self.inner.provider_name, model=self.inner.model_name,
                    request=request, deltas=seen, response=response, streamed=request.stream,
                    label=self.label, secrets=_adapter_secrets(self.inner),
                )
            except OSError as exc:
                log.warning("could not record the answer in %s: %s", self.cache.path, exc)

        return AsyncResponseStream(run(), _Mirror(inner))


# Identity and the rest (normalizing a request too) are the wrapped adapter's: ``Adapter`` defines
# these, so ``__getattr__`` would not be asked.
for _name in ("model_name", "provider_name", "spec", "display_name", "max_context_tokens", "list_models",
              "alist_models", "count_tokens", "validate", "output_mode", "close", "aclose",
              "_request", "provider_options", "backend_mode"):
    setattr(CachedAdapter, _name, property(operator.attrgetter(f"inner.{_name}")))


def cached_model(
    spec: str,
    cache: ResponseCache | str | os.PathLike[str] | None = None,
    *,
    label: str | None = None,
    **options: Any,
) -> CachedAdapter:
    """``spec``'s model behind the response cache (a :class:`ResponseCache` or its path), as
    ``%%chat`` builds it: in ``replay`` mode neither the model, nor its extra, nor a login is
    needed (docs/record-replay.md, "From Python")."""
    from ..replay_only import connect_for_cache

    if not isinstance(cache, ResponseCache):
        cache = ResponseCache(cache)
    return CachedAdapter(connect_for_cache(cache.qualify(spec), cache.mode, **options), cache,
                         label=label)
