"""The :class:`Adapter` contract every provider implements, and what the base gives them for free.

A subclass supplies one attempt of a call (:meth:`Adapter.astream_once`, or
:meth:`Adapter.stream_once` when it blocks); the base adds argument checks, the deadline, cancel
tokens, retries (each a :class:`~dispatch_nb.types.RetryEvent` of the stream), ``partial`` on every
error and one log line per request. The seams: docs/providers.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx

from .bridge import SyncIterator, same_parameters
from .call_control import CallControl
from .cancel import CancelToken
from .cost import Cost, ledger, price, warm_up
from .errors import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    DispatchError,
    RequestError,
)
from .stream import Accumulator, AsyncResponseStream, ResponseStream
from .types import (
    ModelInfo,
    Response,
    RetryEvent,
    StreamDelta,
    ToolDefinition,
    Usage,
    as_messages,
)
from .validation import BLANK_PROMPT, check_call, check_entry, check_tools, describe, is_blank
from .wire.request import ChatRequest, requested_mode, unsupported_mode

__all__ = ["Adapter", "ChatRequest", "ValidationResult", "normalize_tools"]

logger = logging.getLogger("dispatch_nb")

#: options every adapter understands (providers add their own)
COMMON_OPTIONS = frozenset({"tool_choice", "stop", "top_p", "extra_body", "extra_headers", "max_retries"})

#: a retried error's class → how a :class:`RetryEvent` says it
_RETRY_REASONS = {
    "RateLimitError": "rate limited",
    "ServerError": "the server failed",
    "APIConnectionError": "the connection failed",
    "APITimeoutError": "the request timed out",
}

RETRY_AFTER_CAP = 60.0
BACKOFF_BASE = 0.5
BACKOFF_CAP = 8.0


@dataclass
class ValidationResult:
    """What :meth:`Adapter.validate` found; truthy when the provider is usable."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def normalize_tools(tools: Iterable[Any] | None) -> list[ToolDefinition | dict[str, Any]]:
    """Accept ToolDefinition, ``{"name", "description", "parameters"}`` dicts, ``@tool`` objects,
    typed functions and MCP servers; other dicts (``{"type": "web_search"}``) are provider
    built-in tools and pass through untouched."""
    check_tools(tools)
    if not tools:
        return []
    out: list[ToolDefinition | dict[str, Any]] = []
    for t in tools:
        if isinstance(t, ToolDefinition):
            out.append(t)
        elif isinstance(t, dict):
            if "name" in t and "type" not in t:
                out.append(ToolDefinition.model_validate(t))
            elif "name" in t and t.get("type") == "function" and "parameters" in t:
                out.append(
                    ToolDefinition(
                        name=t["name"],
                        description=t.get("description", ""),
                        parameters=t["parameters"],
                    )
                )
            else:
                out.append(dict(t))
        elif isinstance(getattr(t, "definition", None), ToolDefinition):
            out.append(t.definition)
        elif type(t).__name__ == "MCPServer" and hasattr(t, "list_tools"):
            # an MCP server declares its tools (started and listed now); the calls come back
            # to the caller (server.call(...)), a Session runs them
            out.extend(t.list_tools())
        elif callable(t):
            from .tools import tool as make_tool

            out.append(make_tool(t).definition)
        else:
            raise TypeError(
                f"a tool must be a ToolDefinition, a dict with name/description/parameters, "
                f"an @tool function or a typed function, not {type(t).__name__}"
            )
    names = [t.name for t in out if isinstance(t, ToolDefinition)]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"tool names must be unique; repeated: {', '.join(dupes)}")
    return out


def backoff_delay(
    attempt: int, retry_after: float | None, base: float = BACKOFF_BASE
) -> float | None:
    """Seconds before retry ``attempt`` (0-based): the server's ``retry-after`` when sane (0 <
    value ≤ 60 s), else ``base``·2ⁿ s capped at 8 s, minus up to 25 % jitter. None when the server
    asks for longer: no retry (the error's ``retry_after`` tells the caller how long to wait)."""
    if retry_after is not None:
        if retry_after > RETRY_AFTER_CAP:
            return None
        if retry_after > 0:
            return retry_after
    delay: float = min(base * (2**attempt), BACKOFF_CAP)
    return float(delay * (1 - 0.25 * random.random()))


class Adapter:
    """Base class of every provider adapter: a subclass supplies :attr:`model_name` and one
    attempt of a call (the seams: docs/providers.md)."""

    #: extra ``**options`` this provider accepts besides :data:`COMMON_OPTIONS`
    provider_options: frozenset[str] = frozenset()
    #: e.g. "official" / "compatible"; appears in the request log line
    backend_mode: str | None = None
    #: how ``output=`` is asked for when a call does not say: ``"auto"`` (the provider picks per
    #: model), ``"native"``, ``"tool"``, ``"json_object"`` or ``"prompt"`` (docs/structured-output.md)
    structured_output: str = "auto"

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        max_retries: int = 2,
    ) -> None:
        if max_retries is None:  # a call's None means "the adapter's": the adapter needs a number
            raise TypeError(f"{type(self).__name__}: max_retries must be a whole number, 0 or "
                            "more — not None")
        check_call(f"{type(self).__name__}: ", max_tokens=max_tokens, timeout=timeout,
                   max_retries=max_retries)
        #: the per-call default for ``max_tokens``
        self.default_max_tokens = max_tokens
        #: the per-call default total deadline in seconds (None: no deadline)
        self.default_timeout = timeout
        #: retries after a retryable failure (408/409/429/5xx/529, a broken connection)
        self.max_retries = max_retries
        #: seconds before the first retry when the server gives no ``retry-after``; doubles with
        #: each retry (capped at 8 s), with jitter
        self.retry_backoff = BACKOFF_BASE

    # -- identity ------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The model this adapter talks to (``_model``, which a subclass sets)."""
        model: str | None = getattr(self, "_model", None)
        if model is None:
            raise NotImplementedError(f"{type(self).__name__} must define model_name")
        return model

    @property
    def provider_name(self) -> str:
        """The provider's registry name (``openai``, ``copilot``...)."""
        return type(self).__name__

    @property
    def spec(self) -> str:
        """``provider:model``, as :func:`~dispatch_nb.connect` takes it and answers' footers name
        the model (``openai:gpt-4.1``)."""
        return f"{self.provider_name}:{self.model_name}"

    @property
    def display_name(self) -> str:
        """A human name for the provider, e.g. "GitHub Copilot"."""
        return self.provider_name

    @property
    def max_context_tokens(self) -> int | None:
        """The model's context window in tokens, when known."""
        return None

    def list_models(self) -> list[ModelInfo]:
        """The models this provider offers."""
        raise NotImplementedError(f"{type(self).__name__} cannot list models")

    async def alist_models(self) -> list[ModelInfo]:
        """The async twin of :meth:`list_models`."""
        return await asyncio.to_thread(self.list_models)

    #: how :meth:`count_tokens` counts, as :func:`dispatch_nb.estimate` reports it
    token_counter = "count_tokens"

    def count_tokens(
        self,
        messages: Any,
        system: str | None = None,
        tools: Iterable[Any] | None = None,
    ) -> int:
        """Tokens the prompt would use, or ``-1`` where the provider cannot count."""
        return self._count_tokens(self._request(
            messages, system=system, tools=tools, stream=False, max_tokens=None,
            temperature=None, options={},
        ))

    def _count_tokens(self, request: ChatRequest) -> int:
        """What a provider that can count overrides: the tokens of ``request``'s prompt."""
        return -1

    def validate(self) -> ValidationResult:
        """One cheap authenticated call: is the provider configured and are credentials accepted?"""
        try:
            models = self.list_models()
        except NotImplementedError:
            return ValidationResult(True, "configured (this provider cannot be checked remotely)")
        except AuthenticationError as exc:
            return ValidationResult(
                False, f"{self.display_name} rejected the credentials: {exc.message}"
            )
        except DispatchError as exc:
            return ValidationResult(False, f"{self.display_name} could not be checked: {exc}")
        count = f"{len(models)} model{'' if len(models) == 1 else 's'}"
        return ValidationResult(True, f"{self.display_name} accepted the credentials ({count})")

    def close(self) -> None:
        """Release connections. The adapter stays usable (clients are recreated on demand)."""

    async def aclose(self) -> None:
        """The async twin of :meth:`close` (by default :meth:`close` itself)."""
        self.close()

    def __enter__(self) -> Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            model = self.model_name
        except NotImplementedError:
            model = "?"
        return f"{type(self).__name__}(model={model!r})"

    # -- what subclasses supply ---------------------------------------------------------------
    async def astream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> AsyncIterator[StreamDelta]:
        """One streaming attempt: yield deltas made by ``acc``; raise DispatchError on failure.
        A cancel or the deadline of ``control`` cancels the task (``control.error()`` says why).
        By default :meth:`stream_once`, on a worker thread."""
        async for delta in _thread_bridge(lambda: self.stream_once(request, acc, control),
                                          control):
            yield delta

    def stream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> Iterator[StreamDelta]:
        """One attempt of a provider whose work blocks (an in-process model), on a worker thread.
        Call ``control.check()`` between steps: that is how a cancel or the deadline reaches it."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement astream_once (or stream_once, if it blocks)"
        )

    def output_mode(self, request: ChatRequest) -> str | None:
        """The mechanism this adapter uses for ``request.output`` (None without one). Providers
        with a native one override this; the base puts the schema into the system prompt."""
        if request.output is None:
            return None
        mode = requested_mode(self, request)
        if mode not in ("auto", "prompt"):
            raise unsupported_mode(self, mode, ("auto", "prompt"))
        return "prompt"

    def batch_api(self) -> Any:
        """The provider's :class:`~dispatch_nb.providers.batch_api.BatchAPI` (half the price,
        answered within 24 h) for ``batch(..., deferred=True)``; None: it has none."""
        return None

    def should_retry_now(self, error: DispatchError) -> bool:
        """True: resend at once after ``error``, outside the retry budget (a server quirk learnt).
        Only asked while nothing reached the caller and the call is neither cancelled nor late."""
        return False

    # -- normalization ---------------------------------------------------------------------------
    def _request(
        self,
        messages: Any,
        *,
        system: str | None,
        tools: Iterable[Any] | None,
        stream: bool,
        max_tokens: int | None,
        temperature: float | None,
        options: dict[str, Any],
    ) -> ChatRequest:
        unknown = set(options) - COMMON_OPTIONS - self.provider_options
        if unknown:
            import difflib
            import inspect

            named = [p.name for p in inspect.signature(Adapter._prepare).parameters.values()
                     if p.kind is p.KEYWORD_ONLY]
            supported = sorted({*named, *COMMON_OPTIONS, *self.provider_options})
            close = [m for name in sorted(unknown) for m in difflib.get_close_matches(name, supported, 1)]
            raise TypeError(
                f"{self.display_name} does not understand option(s) {', '.join(sorted(unknown))}"
                f"{' (did you mean ' + ', '.join(close) + '?)' if close else ''}; "
                f"supported: {', '.join(supported)}"
            )
        msgs = as_messages(messages)
        if not msgs:
            raise RequestError(
                "there is nothing to send: pass at least one message", provider=self.provider_name
            )
        if is_blank(msgs[-1]):  # Anthropic refuses it (400), others answer nonsense
            raise RequestError(BLANK_PROMPT, provider=self.provider_name)
        check_call(max_tokens=max_tokens, temperature=temperature,
                   max_retries=options.get("max_retries"))
        return ChatRequest(
            messages=msgs,
            system=system,
            tools=normalize_tools(tools),
            max_tokens=max_tokens if max_tokens is not None else self.default_max_tokens,
            temperature=temperature,
            stream=stream,
            options=dict(options),
        )

    def _control(self, timeout: float | None, cancel: CancelToken | None) -> CallControl:
        return CallControl(
            timeout=timeout if timeout is not None else self.default_timeout,
            cancel=cancel,
            provider=self.provider_name,
        )

    # -- the retry loop --------------------------------------------------------------------------
    def _next_attempt(
        self, exc: DispatchError, acc: Accumulator, attempt: int, retries: int, control: CallControl
    ) -> float | None:
        """After failed attempt ``attempt``: seconds to wait before the next one (``acc`` reset;
        ``-1.0``: resend at once, as :meth:`should_retry_now` asks), or None to raise ``exc``.
        Raises the abort error when the call was cancelled or timed out meanwhile."""
        if control.reason is not None and not isinstance(exc, type(control.error())):
            raise control.error() from exc
        if acc.started or control.reason is not None:
            return None
        delay = -1.0
        if not self.should_retry_now(exc):
            if attempt >= retries or not exc.retryable or exc.code == "quota_exceeded":
                return None
            wait = backoff_delay(attempt, exc.retry_after, self.retry_backoff)
            remaining = control.remaining()
            if wait is None or (remaining is not None and wait >= remaining):
                return None
            delay = wait
        # marked ``dispatch_nb_event``: a front end that shows the stream's RetryEvent need not
        # show the line
        logger.warning(
            "retrying %s %s after %s: %s%s (attempt %d, waiting %.2fs)",
            self.provider_name,
            self.model_name,
            type(exc).__name__,
            exc.message,
            f" [HTTP {exc.status_code}]" if exc.status_code else "",
            attempt + 1,
            max(delay, 0.0),
            extra={"dispatch_nb_event": "retry"},
        )
        acc.reset()
        return delay

    def _log_request(
        self,
        request: ChatRequest,
        acc: Accumulator,
        control: CallControl,
        retries: int,
        error: BaseException | None,
    ) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        if error is None:
            status = "ok"
        elif isinstance(error, GeneratorExit):
            status = "closed"  # the caller stopped reading (close(), break, an exception)
        else:
            status = type(error).__name__
        code = getattr(error, "status_code", None)
        output = ""
        if request.output is not None:
            try:
                output = f" output={self.output_mode(request)}"
            except ValueError:
                output = " output=?"
        logger.info(
            "request provider=%s backend=%s model=%s stream=%s status=%s%s latency=%.3fs "
            "retries=%d input_tokens=%d output_tokens=%d cache_read_tokens=%d%s",
            self.provider_name,
            self.backend_mode or "-",
            self.model_name,
            request.stream,
            status,
            f"/{code}" if code else "",
            control.elapsed(),
            retries,
            acc.usage.input_tokens,
            acc.usage.output_tokens,
            acc.usage.cache_read_tokens,
            output,
        )

    def price_call(self, request: ChatRequest, model: str, usage: Usage, *,
                   batch: bool = False) -> Cost | None:
        """What one successful call with ``usage`` cost (docs/cost.md): the price of the model
        asked for (else the one the server named); ``None`` when unknown. ``batch``: the
        provider's batch-API price."""
        return (price(self.provider_name, self.model_name, usage, batch=batch)
                or (price(self.provider_name, model, usage, batch=batch) if model else None))

    def _priced(self, request: ChatRequest, acc: Accumulator, *, batch: bool = False) -> None:
        """The attempt succeeded: price its usage and enter it in the ledger (``%chat cost``)."""
        try:
            acc.cost = self.price_call(request, acc.model, acc.usage, batch=batch)
        except Exception as exc:  # a price lookup never fails a call
            logger.warning("could not price %s %s: %s", self.provider_name, self.model_name, exc)
            acc.cost = None
        ledger.record(self.provider_name, self.model_name, acc.usage, acc.cost)

    async def _adeltas(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> AsyncIterator[StreamDelta]:
        retries = request.options.get("max_retries")
        if retries is None:
            retries = self.max_retries
        attempt = 0
        error: BaseException | None = None
        warm_up(self.provider_name)  # the price data loads while the request is under way
        control.start_async(asyncio.get_running_loop())
        try:
            while True:
                control.check()
                try:
                    if request.stream:
                        async for delta in self.astream_once(request, acc, control):
                            yield delta
                    else:  # the attempt fills acc; a caller that did not stream sees no delta
                        async for _ in self.astream_once(request, acc, control):
                            pass
                    self._priced(request, acc)
                    return
                except DispatchError as exc:
                    delay = self._next_attempt(exc, acc, attempt, retries, control)
                    if delay is None:
                        raise
                    if delay >= 0:  # a retry, not a resend that works around a quirk
                        reason = _RETRY_REASONS.get(type(exc).__name__, type(exc).__name__)
                        status = f", HTTP {exc.status_code}" if exc.status_code else ""
                        yield RetryEvent(attempt=attempt + 1, wait=delay, reason=reason + status)
                        await control.asleep(delay)
                    attempt += 1
        except BaseException as exc:
            error = exc
            raise
        finally:
            control.stop()
            self._log_request(request, acc, control, attempt, error)

    # -- one call as a stream --------------------------------------------------------------------
    def open_stream(
        self, request: ChatRequest, timeout: float | None, cancel: CancelToken | None
    ) -> ResponseStream:
        """One normalized call as the :class:`ResponseStream` that :meth:`stream` returns and
        :meth:`chat` drains; the seam a wrapper (the response cache) overrides."""
        request = self._with_output_prompt(request)
        acc = Accumulator(self.model_name, self.spec)
        control = self._control(timeout, cancel)
        return ResponseStream(SyncIterator(lambda: self._adeltas(request, acc, control)), acc)

    def aopen_stream(
        self, request: ChatRequest, timeout: float | None, cancel: CancelToken | None
    ) -> AsyncResponseStream:
        """The async twin of :meth:`open_stream`."""
        request = self._with_output_prompt(request)
        acc = Accumulator(self.model_name, self.spec)
        control = self._control(timeout, cancel)
        return AsyncResponseStream(self._adeltas(request, acc, control), acc)

    def _with_output_prompt(self, request: ChatRequest) -> ChatRequest:
        """``request`` with the schema in its system prompt when its output mode is ``prompt``
        (after a response cache looked the request up, so keys never depend on it)."""
        if request.output is not None and self.output_mode(request) == "prompt":
            from .structured import prompted

            return prompted(request)
        return request

    # -- public entry points ---------------------------------------------------------------------
    def _prepare(
        self,
        messages: Any,
        *,
        system: str | None = None,
        tools: Iterable[Any] | None = None,
        stream: bool = False,
        on_delta: Callable[[StreamDelta], Any] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        cancel: CancelToken | None = None,
        output: Any = None,
        output_retries: int | None = None,
        **options: Any,
    ) -> _Call:
        """The parameters of the four entry points (:meth:`chat` says what they mean), checked
        and normalized before anything is sent."""
        messages, system = check_entry(messages, system=system, timeout=timeout, cancel=cancel,
                                       stream=stream)
        request = self._request(
            messages, system=system, tools=tools, stream=stream, max_tokens=max_tokens,
            temperature=temperature, options=options,
        )
        if output is None and output_retries is not None:
            raise TypeError("output_retries= needs output= (the type or schema to validate)")
        if on_delta is not None and not callable(on_delta):
            raise TypeError(f"on_delta must be a function of one delta — not {describe(on_delta)}")
        return _Call(request, timeout, cancel, output, output_retries, on_delta)

    def _open(self, call: _Call, *, asynchronous: bool) -> Any:
        """Open a prepared call's stream (validated against ``output=``, if given): a
        :class:`ResponseStream`, or an :class:`AsyncResponseStream` when ``asynchronous``."""
        request, timeout, cancel, output = call.request, call.timeout, call.cancel, call.output
        if output is None:
            if asynchronous:
                return self.aopen_stream(request, timeout, cancel)
            return self.open_stream(request, timeout, cancel)
        from .structured import open_structured

        return open_structured(self, request, output, call.output_retries, timeout, cancel,
                               asynchronous=asynchronous)

    def _streaming(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """:meth:`stream` / :meth:`astream`: always streamed (``stream=``, ``on_delta=`` ignored)."""
        kwargs.pop("on_delta", None)
        kwargs["stream"] = True
        return self._prepare(*args, **kwargs)

    @same_parameters(_prepare, hide=("stream", "on_delta"))
    def stream(self, *args: Any, **kwargs: Any) -> ResponseStream:
        """Start a streaming call: iterate the result for deltas, then read ``.response``.

        ``output`` (a pydantic model class, a type, or a JSON Schema dict) asks for a structured
        answer: ``.response.parsed`` holds it validated (``.partial_parsed`` while it grows); an
        invalid answer is sent back ``output_retries`` times (default 1) before
        :class:`~dispatch_nb.errors.OutputValidationError` (docs/structured-output.md).
        """
        stream: ResponseStream = self._open(self._streaming(args, kwargs), asynchronous=False)
        return stream

    @same_parameters(_prepare)
    def chat(self, *args: Any, **kwargs: Any) -> Response:
        """Send ``messages`` and return the :class:`Response`.

        With ``stream=True`` the answer is streamed and ``on_delta`` sees every delta; without
        it the answer arrives whole, and ``on_delta`` sees only a retry's ``RetryEvent``. With
        ``output=`` (a pydantic model class, a type, or a JSON Schema dict) the answer is
        validated into ``Response.parsed`` (see :meth:`stream`).
        """
        call = self._prepare(*args, **kwargs)
        on_delta = call.on_delta
        deltas: ResponseStream
        with self._open(call, asynchronous=False) as deltas:
            for delta in deltas:
                if on_delta is not None:
                    on_delta(delta)
            return deltas.response

    @same_parameters(_prepare, hide=("stream", "on_delta"))
    def astream(self, *args: Any, **kwargs: Any) -> AsyncResponseStream:
        """The async twin of :meth:`stream` (``async for delta in adapter.astream(...)``)."""
        stream: AsyncResponseStream = self._open(self._streaming(args, kwargs), asynchronous=True)
        return stream

    @same_parameters(_prepare)
    async def achat(self, *args: Any, **kwargs: Any) -> Response:
        """The async twin of :meth:`chat`. ``on_delta`` may be a plain or an async function."""
        call = self._prepare(*args, **kwargs)
        on_delta = call.on_delta
        deltas: AsyncResponseStream
        async with self._open(call, asynchronous=True) as deltas:
            async for delta in deltas:
                if on_delta is not None:
                    result = on_delta(delta)
                    if asyncio.iscoroutine(result):
                        await result
            return deltas.response


class _Call(NamedTuple):
    """One entry point's call, checked (:meth:`Adapter._prepare`) and ready to open."""

    request: ChatRequest
    timeout: float | None
    cancel: CancelToken | None
    output: Any
    output_retries: int | None
    on_delta: Callable[[StreamDelta], Any] | None


#: deltas a worker thread may run ahead of an async consumer (see _thread_bridge)
BRIDGE_BUFFER = 64


async def _thread_bridge(
    make: Callable[[], Iterator[StreamDelta]], control: CallControl
) -> AsyncIterator[StreamDelta]:
    """Run a sync delta iterator on a worker thread and yield its items on the event loop; at
    most :data:`BRIDGE_BUFFER` wait in between (a slow consumer slows the worker)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    credit = threading.Semaphore(BRIDGE_BUFFER)
    stop = threading.Event()

    def put(kind: str, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone; nobody is listening
            stop.set()

    def worker() -> None:
        items: Iterator[StreamDelta] | None = None
        try:
            items = make()  # an attempt that fails at once raises here
            for item in items:
                while not credit.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                put("item", item)
            put("done", None)
        except BaseException as exc:
            put("error", exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    # the worker sees this task's context (e.g. which thread a sync call is made for)
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(worker,), name="dispatch_nb-bridge",
                              daemon=True)
    thread.start()
    ended = False  # the worker said it is done (or failed): it stops by itself
    try:
        while True:
            kind, value = await queue.get()
            if kind == "item":
                credit.release()
                yield value
            elif kind == "done":
                ended = True
                return
            else:
                ended = True
                raise value
    finally:
        stop.set()
        credit.release()
        if thread.is_alive():
            if not ended:
                control.abort("cancel")
            await asyncio.to_thread(thread.join, 5)


def wrap_transport_error(exc: BaseException, provider: str) -> DispatchError:
    """An httpx/OS error as the matching :class:`DispatchError` (timeouts → APITimeoutError)."""
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(
            f"the server did not answer in time ({type(exc).__name__})", provider=provider
        )
    text = str(exc) or type(exc).__name__
    try:  # the URL httpx was sending to (without its query, which may hold a key)
        url = exc.request.url.copy_with(query=None) if isinstance(exc, httpx.RequestError) else None
    except RuntimeError:  # no request attached
        url = None
    if isinstance(exc, httpx.ConnectError):
        error = APIConnectionError(f"could not connect to {url or 'the server'}: {text}",
                                   provider=provider)
        error.connect_failed = True
        return error
    where = f" ({url})" if url is not None else ""
    return APIConnectionError(f"could not reach the server or the connection broke{where}: {text}",
                              provider=provider)

