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

__all__ = ["StreamParser", "WireFormat", "WireRequest", "answer_object", "merge_delta", "provider_entry"]


def answer_object(body: Any, provider: str) -> dict[str, Any]:
    """A non-streamed answer, which every format sends as a JSON object (else the error)."""
    if not isinstance(body, dict):
        raise APIConnectionError(
            f"the server answered with an unexpected body: {str(body)[:200]!r}", provider=provider
        )
    return body


def provider_entry(block: Any, key: str) -> dict[str, Any]:
    """A block's ``provider_data[key]``, one wire format's opaque data (``{}`` when it has none)."""
    data = (block.provider_data or {}).get(key)
    return data if isinstance(data, dict) else {}


def merge_delta(block: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Merge a streamed piece of a block no rule covers into the block (Anthropic's
    ``compaction_delta``, chat.completions parts of unknown types): strings appended, lists
    extended, dicts updated, anything else set. List and dict fields are replaced, never changed
    in place (a shallow copy of a block, or a snapshot of it, keeps its own)."""
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
    """Turns one provider's SSE events into deltas (through the accumulator it was given):
    ``complete`` at its terminal event; ``feed`` raises a :class:`DispatchError` for an in-stream
    error."""

    complete: bool

    def feed(self, event: ServerSentEvent) -> Iterable[StreamDelta]: ...

    def end(self) -> Iterable[StreamDelta]: ...


class WireFormat(Protocol):
    """One wire format for one server (docs/providers.md describes each member). A format is a
    frozen dataclass that subclasses this protocol, which gives it ``wire_request`` (``POST
    {path}`` with its body), ``output_mode_for`` and ``should_resend``."""

    name: ClassVar[str]
    path: ClassVar[str]
    options: ClassVar[frozenset[str]]
    output_modes: ClassVar[tuple[str, ...]] = ("tool", "prompt")
    provider: str

    @property
    def native_output(self) -> str: ...

    def build_body(
        self, request: ChatRequest, model: str, *, output_mode: str | None = None
    ) -> dict[str, Any]:
        """The JSON body for ``request`` sent to ``model`` (``output_mode``: how ``output=`` goes
        on the wire, as the adapter's ``output_mode`` chose)."""
        ...

    def stream_parser(self, acc: Accumulator) -> StreamParser:
        """A fresh parser for one streamed answer, filling ``acc``."""
        ...

    def parse_body(self, body: Any, acc: Accumulator) -> None:
        """Fill ``acc`` from a non-streamed JSON answer."""
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
        body = self.build_body(request, model, output_mode=output_mode)
        return WireRequest("POST", self.path, json=body, headers=dict(headers or {}), wire=self)

    def output_mode_for(self, adapter: Any, request: ChatRequest) -> str | None:
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
        """The wire format to resend with when ``error`` shows a quirk this one did not know:
        None here (a format that can learn one overrides this)."""
        return None


@dataclass
class WireRequest:
    """An HTTP request a provider wants sent: ``url`` is absolute or relative to base_url;
    ``wire`` the wire format that reads its answer (None: the adapter's ``wire``)."""

    method: str
    url: str
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    wire: WireFormat | None = None
