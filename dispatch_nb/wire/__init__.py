"""Wire formats, apart from the providers that speak them (sans-I/O; one module per format):
``chat_completions``, ``responses``, ``anthropic``, ``canonical``. Each is a frozen object built
from a frozen description of one server's quirks; what they are given is ``wire.request``'s
:class:`ChatRequest`. docs/providers.md lists them and the :class:`WireFormat` protocol.

Names are imported lazily (``from dispatch_nb.wire import ChatCompletionsWire`` loads only that
format's module).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import StreamParser, WireFormat, WireRequest
from .request import ChatRequest

if TYPE_CHECKING:
    from .anthropic import MessagesQuirks, MessagesWire
    from .canonical import CanonicalWire
    from .chat_completions import ChatCompletionsWire, ChatQuirks
    from .responses import ResponsesQuirks, ResponsesWire

__all__ = [
    "CanonicalWire",
    "ChatCompletionsWire",
    "ChatQuirks",
    "ChatRequest",
    "MessagesQuirks",
    "MessagesWire",
    "ResponsesQuirks",
    "ResponsesWire",
    "StreamParser",
    "WireFormat",
    "WireRequest",
]

_LAZY = {
    "ChatCompletionsWire": "chat_completions",
    "ChatQuirks": "chat_completions",
    "ResponsesWire": "responses",
    "ResponsesQuirks": "responses",
    "MessagesWire": "anthropic",
    "MessagesQuirks": "anthropic",
    "CanonicalWire": "canonical",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
