"""What every wire format gives the HTTP layer: a request to send (carrying the wire format itself)
and the parser of its answer; docs/providers.md describes the :class:`WireFormat` protocol.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..errors import APIConnectionError
from ..sse import ServerSentEvent
from ..types import StreamDelta
from .request import requested_mode, unsupported_mode

if TYPE_CHECKING:
    from ..errors import DispatchError
    from ..stream import Accumulator
    from .request import ChatRequest

__all__ = [
    "StreamParser", "WireBase", "WireFormat", "WireRequest", "answer_object", "merge_delta",
]


def answer_object(body: Any, provider: str) -> dict[str, Any]:
    """A non-streamed answer, which every format sends as a JSON object (else the error)."""
    if not isinstance(body, dict):
        raise APIConnectionError(
            f"the server answered with an unexpected body: {str(body)[:200]!r}", provider=provider
        )
    return body


def merge_delta(block: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Merge a streamed piece of a block no rule covers into the block, the way such streams build
    it (Anthropic's ``compaction_delta {"content": "..."}`` fills a ``compaction`` block's
    ``content``; chat.completions content parts of unknown types come in pieces): a string is
    appended to the field of the same name, a list field receives the value (or its items), a
    dict field is updated, anything else is set. Only ``block`` changes: its list and dict fields
    are replaced, never changed in place (a shallow copy of a block, or a snapshot of it, keeps
    its own)."""
    for name, value in delta.items():
        if name == "type":
            continue
        current = block.get(name)
        if isinstance(value, str) and (current is None or isinstance(current, str)):
            block[name] = (current or "") + value
        elif isinstance(current, list):
            block[name] = [*current, *value] if isinstance(value, list) else [*current, value]
        elif isinstance(current, dict) and isinstance(value, dict):
            block[name] = {**current, **value}
        else:
            block[name] = value


class StreamParser(Protocol):
    """Turns one provider's SSE events into deltas (through the accumulator it was given).

    ``complete`` becomes True at the provider's terminal event; reading stops there.
    ``feed`` raises a :class:`DispatchError` for an in-stream error event.
    """

    complete: bool

    def feed(self, event: ServerSentEvent) -> Iterable[StreamDelta]: ...

    def end(self) -> Iterable[StreamDelta]: ...


class WireFormat(Protocol):
    """One wire format for one server (see the module docstring).

    ``name`` (e.g. ``"chat.completions"``) appears in logs as the adapter's backend; ``path`` is
    where requests go, relative to the provider's base URL; ``options`` the per-call options the
    format understands; ``provider`` the name its errors carry; ``native_output`` how ``output=``
    goes natively (e.g. ``"response_format"``) and ``output_modes`` the other structured-output
    modes a call may ask for.
    """

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def provider(self) -> str: ...

    @property
    def options(self) -> frozenset[str]: ...

    @property
    def native_output(self) -> str: ...

    @property
    def output_modes(self) -> tuple[str, ...]: ...

    def build_body(
        self, request: ChatRequest, model: str, *, output_mode: str | None = None
    ) -> dict[str, Any]:
        """The JSON body for ``request`` sent to ``model`` (``output_mode``: how ``output=`` goes
        on the wire, as the adapter's ``output_mode`` chose)."""
        ...

    def wire_request(
        self,
        request: ChatRequest,
        model: str,
        *,
        output_mode: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> WireRequest:
        """``POST {path}`` with :meth:`build_body`, carrying this wire format."""
        ...

    def stream_parser(self, acc: Accumulator) -> StreamParser:
        """A fresh parser for one streamed answer, filling ``acc``."""
        ...

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        """Fill ``acc`` from a non-streamed JSON answer."""
        ...

    def should_resend(self, error: DispatchError) -> WireFormat | None:
        """The wire format to resend with when ``error`` shows a quirk this one did not know
        (else None)."""
        ...


@dataclass
class WireRequest:
    """An HTTP request a provider wants sent: ``url`` is absolute or relative to base_url.

    ``wire``: the wire format the request was built for; the HTTP layer reads the answer with its
    :meth:`~WireFormat.stream_parser` / :meth:`~WireFormat.parse_body`. None (a provider that
    implements the parsing itself) means the adapter's
    :meth:`~dispatch_nb.http_adapter.HTTPAdapter.stream_parser` /
    :meth:`~dispatch_nb.http_adapter.HTTPAdapter.parse_body`."""

    method: str
    url: str
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    wire: WireFormat | None = None


class WireBase:
    """What every wire format shares (each is a frozen dataclass built on this): the class-level
    facts it sets (described in :class:`WireFormat`), and its request, ``POST {path}`` with its
    body."""

    name: ClassVar[str]
    path: ClassVar[str]
    options: ClassVar[frozenset[str]]
    output_modes: ClassVar[tuple[str, ...]] = ("tool", "prompt")

    def wire_request(
        self: WireFormat,
        request: ChatRequest,
        model: str,
        *,
        output_mode: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> WireRequest:
        """``POST {path}`` with :meth:`build_body`, carrying this wire format."""
        body = self.build_body(request, model, output_mode=output_mode)
        return WireRequest("POST", self.path, json=body, headers=dict(headers or {}), wire=self)

    def output_mode_for(self: WireFormat, adapter: Any, request: ChatRequest) -> str | None:
        """How ``request.output`` goes on this format for ``adapter`` (None without one):
        ``auto`` / ``native`` is :attr:`native_output`, another mode one of :attr:`output_modes`
        (else a ``ValueError`` naming them)."""
        if request.output is None:
            return None
        mode = requested_mode(adapter, request)
        if mode in ("auto", "native"):
            return self.native_output
        if mode in self.output_modes:
            return mode
        raise unsupported_mode(adapter, mode, ("auto", "native", *self.output_modes))

    def should_resend(self, error: DispatchError) -> WireFormat | None:
        """None: no error teaches this format a quirk it did not know (a format that can learn
        one overrides this)."""
        return None
