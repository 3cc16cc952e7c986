"""One attempt of a call over HTTP: :class:`HTTPAdapter`, the base of every HTTP provider.

A provider stays sans-I/O: its wire format (:mod:`dispatch_nb.wire`) builds the request and parses
the answer, the provider adds endpoint, credentials and error mapping (docs/providers.md); this
module sends, reads the SSE body and maps transport errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx
import orjson

from .adapter import Adapter, ChatRequest, wrap_transport_error
from .bridge import run_sync, running_loop, same_parameters
from .call_control import CallControl
from .errors import (
    APIConnectionError,
    DispatchError,
    ModelUnavailableError,
    error_for_status,
    looks_like_html,
    sent_credentials,
    summarize_body,
)
from .sse import ServerSentEvent, SSEDecoder
from .stream import Accumulator
from .transport import READ_EXTENSION, LoopClients, async_client, prepare_async_transport
from .types import StreamDelta
from .wire.base import StreamParser, WireFormat, WireRequest

__all__ = ["BaseURLError", "HTTPAdapter", "StreamParser", "WireFormat", "WireRequest", "error_details"]

USER_AGENT = "dispatch-nb/0.1"
#: seconds a chat's connection may take to open, and each read of its answer
HTTP_TIMEOUT = httpx.Timeout(300.0, connect=15.0)
#: seconds a small JSON request (a model list) may take, connect and reads included
JSON_REQUEST_TIMEOUT = 30.0


def error_details(body: bytes) -> tuple[str, str | None]:
    """``(message, provider error type/code)`` from an error body of any common shape: a provider's
    JSON error, or what a proxy or web server sends in its place — an HTML page becomes its title
    and plain text its first line (:func:`~dispatch_nb.errors.summarize_body`), never markup."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            message = err.get("message") or data.get("message")
            if not isinstance(message, str) or not message.strip():
                message = summarize_body(body) if message is None else str(message)
            details = err.get("details")
            types = (details.get("error_code") if isinstance(details, dict) else None,
                     err.get("code"), err.get("type"))
            return message[:2000], next((t for t in types if isinstance(t, str) and t), None)
        if isinstance(err, str):
            return err[:2000], None
    summary = summarize_body(body)
    if looks_like_html(body):
        page = f": {summary}" if summary else ""
        return f"an HTML page from the server or a proxy in between, not the API's answer{page}", None
    return (summary or "the server returned an error with no message"), None


def not_an_answer(body: bytes, provider: str | None) -> APIConnectionError:
    """The error for a success status whose body is not the API's JSON (a proxy's login page, an
    empty body...): not retried, the same request would get it again."""
    hint = "check base_url, or the proxy between you and the provider"
    if not body.strip():
        message = f"the server answered with an empty body instead of the API's JSON: {hint}"
    elif looks_like_html(body):
        page = f" ({summarize_body(body)})" if summarize_body(body) else ""
        message = f"the server answered with an HTML page{page} instead of the API's JSON: {hint}"
    else:
        message = f"the server answered with something that is not JSON ({summarize_body(body)}): {hint}"
    return APIConnectionError(message, provider=provider, code="unexpected_response", retryable=False)


class BaseURLError(ValueError):
    """A base URL that is not ``http(s)://...`` (a replay, which sends nothing, does without it)."""


#: after a streamed answer's terminal event, how long the rest of the body may take to arrive (read
#: to its end, the connection goes back to the pool; else it is dropped)
RELEASE_SECONDS = 0.25


async def _after_terminal(
    read: Callable[[], Awaitable[bytes]],
    decoder: SSEDecoder,
    parser: StreamParser,
    pending: Sequence[ServerSentEvent],
) -> AsyncIterator[StreamDelta]:
    """The answer is complete: read the rest of the body (briefly) so the connection is reused.
    An event in it (``pending``: those that came with the terminal one) still reaches the parser:
    a delta that arrived late joins the answer, nothing that arrived is lost."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RELEASE_SECONDS
    # too slow, a broken connection, or an error event after the end: the answer is complete
    ended = False
    with contextlib.suppress(Exception):
        while True:
            for event in pending:
                for delta in parser.feed(event):
                    yield delta
            remaining = deadline - loop.time()
            if ended or remaining <= 0:
                return
            chunk = await asyncio.wait_for(read(), remaining)
            if chunk:
                pending = decoder.feed(chunk)
            else:
                pending, ended = decoder.end(), True


class HTTPAdapter(Adapter):
    """Base for HTTP providers: an endpoint, credentials and a wire format (the seams:
    docs/providers.md). ``async_http_client``: an ``httpx.AsyncClient`` every request goes
    through (a test's ``httpx.MockTransport``); by default one is made per event loop."""

    #: the wire format of this adapter's requests
    wire: WireFormat | None = None

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None = None,
        headers: Mapping[str, str] | None = None,
        async_http_client: httpx.AsyncClient | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        max_retries: int = 2,
    ) -> None:
        super().__init__(max_tokens=max_tokens, timeout=timeout, max_retries=max_retries)
        if model is not None:
            self._model = model  # what Adapter.model_name gives
        if not isinstance(base_url, str) or not base_url.lower().startswith(("http://", "https://")):
            raise BaseURLError(f"{type(self).__name__}: base_url must start with http:// or https:// "
                               f"(e.g. http://127.0.0.1:8080/v1) — not {base_url!r}")
        self._base_url = base_url.rstrip("/")
        self._extra_headers = dict(headers or {})
        self._async_http_given = async_http_client
        self._async_clients = LoopClients(lambda: async_client(HTTP_TIMEOUT))
        self._parsed_urls: dict[str, httpx.URL] = {}
        #: the credentials this adapter's requests carried (the newest 16): what a server may
        #: quote back, taken out of every error (:meth:`redacted`)
        self._credentials: dict[str, None] = {}

    # -- hooks -----------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """Where requests go (without a trailing slash)."""
        return self._base_url

    def build_request(self, request: ChatRequest) -> WireRequest:
        """The wire request for a call (sans-I/O): by default :attr:`wire`'s."""
        return self._wire_or_raise().wire_request(request, self.model_name,
                                                  output_mode=self.output_mode(request))

    def _parse_body(self, wire: WireRequest, request: ChatRequest, body: Any, acc: Accumulator) -> None:
        """Read a non-streamed answer (a live one or a batch row's) with the request's wire
        format (else :attr:`wire`)."""
        self._wire_or_raise(wire).parse_body(body, acc)

    def _wire_or_raise(self, wire: WireRequest | None = None) -> WireFormat:
        """The wire format that builds a request (``wire`` None) or reads the answer to ``wire``."""
        found = (wire.wire if wire is not None else None) or self.wire
        if found is None:
            name = type(self).__name__
            if wire is None:
                raise NotImplementedError(f"{name} must set wire (a wire format) or implement build_request")
            raise NotImplementedError(f"{name} cannot read the answer: its build_request made a "
                                      "WireRequest without wire= and it sets no wire (a wire format)")
        return found

    def note_credentials(self, request: httpx.Request | None) -> None:
        """Remember the credentials ``request`` carried, so that no error of this adapter repeats
        them."""
        if request is not None:
            for secret in sent_credentials(request.headers):
                self._credentials.pop(secret, None)
                self._credentials[secret] = None
            while len(self._credentials) > 16:
                del self._credentials[next(iter(self._credentials))]

    def redacted(self, error: DispatchError) -> DispatchError:
        """``error`` without a credential this adapter sent or a secret-looking string (a gateway
        may quote the ``Authorization`` header it got)."""
        error.redact(self._credentials)
        return error

    def parse_error(self, status: int, body: bytes, headers: httpx.Headers) -> DispatchError:
        """The error for an HTTP error response (callers :meth:`redacted` it)."""
        message, etype = error_details(body)
        error = error_for_status(
            status,
            message,
            provider=self.provider_name,
            error_type=etype,
            headers=headers,
            request_id=self.error_request_id(body, headers),
        )
        if isinstance(error, ModelUnavailableError) and self.model_name not in error.message:
            error.message += f" [model {self.model_name!r}]"  # the server did not say which
        return error

    def error_request_id(self, body: bytes, headers: httpx.Headers) -> str | None:
        """The id the server gave a failed request (support asks for it), for :meth:`parse_error`."""
        request_id: str | None = headers.get("x-request-id") or headers.get("request-id")
        return request_id

    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate a request (may refresh a token)."""
        return {}

    async def aauth_headers(self) -> dict[str, str]:
        """The async twin of :meth:`auth_headers`."""
        return self.auth_headers()

    def http_auth(self) -> httpx.Auth | None:
        """An :class:`httpx.Auth` flow every request is sent with (None: none), for credentials
        that need a round trip (a token to fetch, refresh after a 401 and retry with)."""
        return None

    def _send_auth(self) -> Any:
        auth = self.http_auth()
        return httpx.USE_CLIENT_DEFAULT if auth is None else auth

    # -- clients ---------------------------------------------------------------------------------
    async def _aclient_ready(self) -> httpx.AsyncClient:
        """The client given, else this loop's, after importing its transport off the event loop (the
        first call of a process would otherwise block the loop — deadlines and cancels too — while
        aiohttp loads)."""
        if self._async_http_given is not None:
            return self._async_http_given
        await prepare_async_transport()
        return self._async_clients.get()

    def close(self) -> None:
        """Close the sync calls' connection pool (async pools close with their event loop). The
        adapter stays usable."""
        if running_loop() is not None:
            run_sync(self._async_clients.aclose())

    async def aclose(self) -> None:
        """Close this event loop's connection pool (the adapter stays usable)."""
        await self._async_clients.aclose()

    def _url(self, url: str) -> str:
        if url.startswith(("http://", "https://")):
            return url
        return f"{self.base_url}/{url.lstrip('/')}"

    def _parsed_url(self, url: str) -> httpx.URL:
        """:meth:`_url` parsed, remembered (httpx parses a URL given as text on every request)."""
        text = self._url(url)
        parsed = self._parsed_urls.get(text)
        if parsed is None:
            if len(self._parsed_urls) >= 64:  # a provider with per-request URLs: keep it small
                self._parsed_urls.clear()
            parsed = self._parsed_urls[text] = httpx.URL(text)
        return parsed

    def _headers(self, wire: WireRequest, auth: Mapping[str, str], request: ChatRequest) -> dict[str, str]:
        """A chat's headers: a plain JSON request's, the wire request's, a JSON body's content type
        unless they name one, then ``extra_headers=``."""
        headers = self._json_headers(auth, wire.headers)
        if wire.json is not None:
            headers.setdefault("content-type", "application/json")
        headers.update(request.options.get("extra_headers") or {})
        return headers

    # -- compressed streams ----------------------------------------------------------------------
    def _content_encoding(self, response: httpx.Response) -> str | None:
        """The stream's ``Content-Encoding`` when it must be decoded (None: identity, so the raw
        bytes go straight to the SSE decoder). Real servers compress event streams; one httpx has
        no decoder for would pass through still compressed: that is an error, said as one."""
        value: str = response.headers.get("content-encoding", "")
        codings = [c for c in (c.strip().lower() for c in value.split(",")) if c not in ("", "identity")]
        if not codings:
            return None
        supported = self._decodable_encodings()
        unknown = [c for c in codings if c not in supported]
        if unknown:
            hint = {"br": " (pip install brotli)", "zstd": " (pip install zstandard)"}
            raise APIConnectionError(
                f"the server compressed its answer as {value!r}, which this installation cannot "
                f"decode{hint.get(unknown[0], '')}; it decodes {', '.join(sorted(supported))}",
                provider=self.provider_name,
                retryable=False,  # the same request gets the same encoding
            )
        return value

    @staticmethod
    def _decodable_encodings() -> frozenset[str]:
        """The content codings httpx decodes here (br and zstd with its optional extras)."""
        codings = {"gzip", "deflate"}
        if any(importlib.util.find_spec(name) for name in ("brotli", "brotlicffi")):
            codings.add("br")
        if importlib.util.find_spec("zstandard"):
            codings.add("zstd")
        return frozenset(codings)

    # -- one attempt -----------------------------------------------------------------------------
    async def astream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> AsyncIterator[StreamDelta]:
        wire = self.build_request(request)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        reading = [False]

        def cancel_read() -> None:
            if reading[0] and task is not None:
                task.cancel()

        def on_abort() -> None:
            loop.call_soon_threadsafe(cancel_read)

        remove_hook = control.on_abort(on_abort)
        response: httpx.Response | None = None
        try:
            reading[0] = True  # a token refresh can take a while: let abort interrupt it too
            client = await self._aclient_ready()
            auth = await self.aauth_headers()
            reading[0] = False
            control.check()
            headers = self._headers(wire, auth, request)
            http_request = client.build_request(
                wire.method, self._parsed_url(wire.url), headers=headers,
                content=None if wire.json is None
                else orjson.dumps({**wire.json, **(request.options.get("extra_body") or {})}),
            )
            reading[0] = True
            self.note_credentials(http_request)
            response = await client.send(http_request, stream=True, auth=self._send_auth())
            self.note_credentials(response.request)  # with what an auth flow added
            reading[0] = False
            control.check()
            if response.status_code >= 400:
                reading[0] = True
                body = await response.aread()
                reading[0] = False
                raise self.parse_error(response.status_code, body, response.headers)
            content_type = response.headers.get("content-type", "")
            if request.stream and "text/event-stream" in content_type:
                parser = self._wire_or_raise(wire).stream_parser(acc)
                decoder = SSEDecoder()
                encoding = self._content_encoding(response)
                # aiohttp's body, read directly (everything that arrived, per wake-up); else httpx's
                read: Callable[[], Awaitable[bytes]] | None = (
                    None if encoding else response.extensions.get(READ_EXTENSION)
                )
                if read is None:  # the next chunk of httpx's iterator, b"" at its end
                    chunks = response.aiter_bytes() if encoding else response.aiter_raw()
                    read = functools.partial(anext, chunks, b"")
                while True:
                    reading[0] = True
                    chunk = await read()
                    reading[0] = False
                    if not chunk:
                        break
                    events = decoder.feed(chunk)
                    for n, event in enumerate(events):
                        for delta in parser.feed(event):
                            yield delta
                        if parser.complete:
                            async for delta in _after_terminal(read, decoder, parser,
                                                               events[n + 1 :]):
                                yield delta
                            return
                    if control.reason is not None or control.deadline is not None:
                        control.check()
                for event in decoder.end():
                    for delta in parser.feed(event):
                        yield delta
                control.check()
                for delta in parser.end():
                    yield delta
            else:
                self._content_encoding(response)  # an encoding httpx cannot decode: say so
                reading[0] = True
                body = await response.aread()
                reading[0] = False
                self._parse_body(wire, request, self._json(body), acc)
        except asyncio.CancelledError:
            if control.reason is None:
                raise
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
            raise control.error() from None
        except DispatchError as exc:  # ours already (APIConnectionError is an OSError too)
            self.redacted(exc)  # (a wire parser's in-stream error too)
            raise
        except httpx.DecodingError as exc:
            control.check()
            encoding = response.headers.get("content-encoding", "?") if response is not None else "?"
            raise APIConnectionError(f"the server's {encoding}-compressed answer could not be "
                                     f"decoded (a corrupt or cut stream): {exc}",
                                     provider=self.provider_name) from None
        except (httpx.HTTPError, OSError) as exc:
            control.check()
            raise self.redacted(wrap_transport_error(exc, self.provider_name)) from None
        finally:
            reading[0] = False
            remove_hook()
            if response is not None:
                await response.aclose()

    def _json(self, body: bytes) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise not_an_answer(body, self.provider_name) from None

    # -- plain JSON requests (models, tokens) ----------------------------------------------------
    def _json_headers(
        self, auth: Mapping[str, str], headers: Mapping[str, str] | None
    ) -> dict[str, str]:
        """The headers of a plain JSON request: ours, the adapter's, ``auth``, then ``headers``."""
        return {"user-agent": USER_AGENT, "accept": "application/json", **self._extra_headers,
                **auth, **(headers or {})}

    @property
    def fixed_headers(self) -> dict[str, str]:
        """The headers every request of this adapter carries (the constructor's ``headers``)."""
        return dict(self._extra_headers)

    async def apost_json(
        self,
        url: str,
        body: Any,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """POST ``body`` as JSON with this adapter's headers and auth (a provider's side request:
        token counting), and return the response whatever its status (read an error with
        :meth:`parse_error`); a transport failure raises the mapped :class:`DispatchError`."""
        return await self._asend("POST", url, {"content-type": "application/json", **(headers or {})},
                                 content=orjson.dumps(body))

    @same_parameters(apost_json)
    def post_json(self, *args: Any, **kwargs: Any) -> httpx.Response:
        """The sync twin of :meth:`apost_json`."""
        return run_sync(self.apost_json(*args, **kwargs))

    async def aget_json(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = JSON_REQUEST_TIMEOUT,
        auth: httpx.Auth | None = None,
    ) -> Any:
        """GET a JSON document with this adapter's auth; HTTP errors become DispatchErrors.
        ``timeout``: a stalled server must not hang ``validate()`` or ``%chat status``; ``auth``:
        this request's :class:`httpx.Auth` instead of :meth:`http_auth`'s."""
        response = await self._asend("GET", url, headers, auth=auth, timeout=timeout)
        if response.status_code >= 400:
            raise self.redacted(self.parse_error(response.status_code, response.content,
                                                 response.headers))
        return self._json(response.content)

    @same_parameters(aget_json)
    def get_json(self, *args: Any, **kwargs: Any) -> Any:
        """The sync twin of :meth:`aget_json`."""
        return run_sync(self.aget_json(*args, **kwargs))

    async def _asend(self, method: str, url: str, headers: Mapping[str, str] | None, *,
                     auth: httpx.Auth | None = None, **kwargs: Any) -> httpx.Response:
        """One plain request with this adapter's headers and auth (``auth``: instead of
        :meth:`http_auth`'s); a transport failure raises the mapped :class:`DispatchError`."""
        try:
            response = await (await self._aclient_ready()).request(
                method, self._url(url), headers=self._json_headers(await self.aauth_headers(), headers),
                auth=auth if auth is not None else self._send_auth(), **kwargs,
            )
        except httpx.HTTPError as exc:
            raise self.redacted(wrap_transport_error(exc, self.provider_name)) from None
        self.note_credentials(response.request)
        return response
