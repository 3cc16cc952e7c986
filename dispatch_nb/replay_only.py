"""Replaying recorded answers where the recorded model cannot run: :func:`connect_for_cache` and
its stand-in, :class:`ReplayOnlyAdapter` (docs/record-replay.md, "Replaying without the model").
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from .adapter import Adapter, ChatRequest, ValidationResult
from .call_control import CallControl
from .errors import DispatchError, ModelUnavailableError
from .http_adapter import BaseURLError
from .registry import (
    connect,
    get_descriptor,
    get_provider,
    parse_model_spec,
    qualify_model_spec,
)
from .stream import Accumulator
from .types import ModelInfo, StreamDelta

__all__ = ["ReplayOnlyAdapter", "connect_for_cache"]


class ReplayOnlyAdapter(Adapter):
    """Stands in for an adapter that cannot be built here, inside a replaying cache.

    It has the real adapter's identity (``provider_name``, ``model_name``) and request defaults
    (``default_max_tokens``, ``provider_options``), so a :class:`~dispatch_nb.cache.CachedAdapter`
    computes the same keys as when the answers were recorded. Every call that would need the
    model raises ``reason`` — the error that prevented building the real adapter.
    """

    def __init__(
        self,
        provider: str,
        model: str,
        *,
        reason: BaseException,
        max_tokens: int | None = None,
        provider_options: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(max_tokens=max_tokens, max_retries=0)
        self._provider = provider
        self._model = model
        #: why the real adapter could not be built (raised by every call that needs the model)
        self.reason = reason
        self.provider_options = provider_options

    @property
    def provider_name(self) -> str:
        return self._provider

    @property
    def display_name(self) -> str:
        return f"{self._provider} (replay only: {self.reason})"

    def __repr__(self) -> str:
        return f"ReplayOnlyAdapter(provider={self._provider!r}, model={self._model!r})"

    def _unavailable(self) -> BaseException:
        if isinstance(self.reason, DispatchError):
            return type(self.reason)(self.reason.message, provider=self._provider)
        return type(self.reason)(str(self.reason))

    def list_models(self) -> list[ModelInfo]:
        raise self._unavailable()

    def validate(self) -> ValidationResult:
        return ValidationResult(False, f"only recorded answers can be replayed: {self.reason}")

    def output_mode(self, request: ChatRequest) -> str | None:
        """Whatever the call asked for: nothing is sent, so any mechanism is fine (the response
        cache's key does not depend on it)."""
        if request.output is None:
            return None
        from .wire.request import requested_mode

        return requested_mode(self, request)

    def stream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> Iterator[StreamDelta]:
        raise self._unavailable()


def _defaults(name: str, factory: Any, model: str,
              options: dict[str, Any]) -> tuple[str, int | None, frozenset[str]]:
    """The provider name, default ``max_tokens`` and accepted options of what ``factory(model,
    **options)`` would build (``factory``: None when its module cannot be imported), read without
    calling it (the order: docs/record-replay.md)."""
    descriptor = get_descriptor(name)
    target = getattr(factory, "func", factory)  # functools.partial
    reported = getattr(target, "provider_name", None)  # a class attribute of the adapter class
    if isinstance(reported, str):
        name = reported
    max_tokens = descriptor.default_max_tokens
    sources: list[dict[str, Any]] = [getattr(factory, "keywords", None) or {}, options]
    if max_tokens is None and factory is not None:  # the factory's own default comes first
        with contextlib.suppress(TypeError, ValueError):
            bound = inspect.signature(factory).bind_partial(model)
            bound.apply_defaults()
            sources.insert(0, dict(bound.arguments))
    for source in sources:
        value = source.get("max_tokens")
        if isinstance(value, int) and not isinstance(value, bool):
            max_tokens = value
        elif "max_tokens" in source and value is None:
            max_tokens = None
    accepted = descriptor.provider_options
    if accepted is None:
        accepted = getattr(target, "provider_options", frozenset())
    return name, max_tokens, frozenset(accepted) if isinstance(accepted, (set, frozenset)) else frozenset()


def connect_for_cache(spec: str, mode: str, **options: Any) -> Adapter:
    """``connect(spec, **options)``; in ``replay`` mode, a :class:`ReplayOnlyAdapter` instead when
    the provider cannot be built here (its extra is not installed, its model file is missing, its
    base URL is not http(s)://: a replay sends nothing). Any other error, a bad option value
    say, is raised.

    In every other mode the error is raised: those modes may need the model. A replay sends
    nothing, so a vendor's bare model name (``gpt-4.1``) is that vendor's here even without its
    credentials (``parse_model_spec(..., sends=False)``).
    """
    if mode == "replay":
        spec = qualify_model_spec(spec, sends=False)
    try:
        return connect(spec, **options)
    except (ImportError, ModelUnavailableError, BaseURLError) as exc:
        if mode != "replay":
            raise
        name, model = parse_model_spec(spec)
        try:
            factory = get_provider(name)
        except ImportError:  # the provider's module itself cannot be imported here
            factory = None
        name, max_tokens, accepted = _defaults(name, factory, model, options)
        return ReplayOnlyAdapter(name, model, reason=exc, max_tokens=max_tokens,
                                 provider_options=accepted)
