"""Wire formats, apart from the providers that speak them (sans-I/O; one module per format).

==========================  ================================  =====================================
module                      wire format object                spoken by
==========================  ================================  =====================================
``wire.chat_completions``   :class:`ChatCompletionsWire`      ``compatible``, Copilot (most models)
``wire.responses``          :class:`ResponsesWire`            ``openai``, Copilot (Codex models)
``wire.anthropic``          :class:`MessagesWire`             ``anthropic``
``wire.canonical``          :class:`CanonicalWire`            ``fake``, :mod:`dispatch_nb.testing`
==========================  ================================  =====================================

Each object is frozen and built from a small frozen description of one server's quirks
(:class:`ChatQuirks`, :class:`ResponsesQuirks`, :class:`MessagesQuirks`), in the spirit of
pydantic-ai's model profiles. It builds the request (``build_body`` / ``wire_request``) and gives
the parser of the answer (``stream_parser`` / ``parse_body``); the
:class:`~dispatch_nb.wire.base.WireRequest` it builds carries it, so the HTTP layer reads each
answer with the format its request was built for. The :class:`~dispatch_nb.wire.base.WireFormat`
protocol is what a new format implements. docs/providers.md shows how a provider is built from one.

What every format is given is ``wire.request``'s :class:`~dispatch_nb.wire.request.ChatRequest`
(with the output-mode helpers providers share); each format owns its JSON Schema dialect
(``wire.openai_schema`` for both OpenAI formats, ``wire.anthropic.anthropic_schema``), over the
schema walking of ``wire.schema``. Nothing in ``wire/`` imports a layer above it
(docs/architecture.md).

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
