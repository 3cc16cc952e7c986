"""Canonical, provider-neutral message and response types: every adapter takes these in and gives
these back, whatever its wire protocol.

Any block may carry ``provider_data``: opaque data a provider needs back verbatim on the next turn
(encrypted reasoning, item ids). It survives ``model_dump()`` / ``model_validate()`` and JSON round
trips unchanged.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from .cost import Cost

__all__ = [
    "Block",
    "ErrorEvent",
    "ImageBlock",
    "Message",
    "MessageDoneEvent",
    "ModelInfo",
    "RedactedThinkingBlock",
    "Response",
    "RetryEvent",
    "StopReason",
    "StreamDelta",
    "StreamEvent",
    "TextBlock",
    "ThinkingBlock",
    "ToolDefinition",
    "ToolResultBlock",
    "ToolResultEvent",
    "ToolUseBlock",
    "Usage",
]

StopReason = Literal[
    "end_turn",
    "tool_use",
    "max_tokens",
    "stop_sequence",
    "content_filter",
    "refusal",
    "pause_turn",
]

ProviderData = dict[str, Any] | None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextBlock(_Model):
    """Plain text the model wrote, or the user's text."""

    type: Literal["text"] = "text"
    text: str
    provider_data: ProviderData = None

    def __init__(self, text: str | None = None, /, **data: Any) -> None:
        if text is not None:
            data["text"] = text
        super().__init__(**data)


class ImageBlock(_Model):
    """An image: ``source`` is an http(s) URL, a ``data:`` URL, or bare base64 with ``media_type``."""

    type: Literal["image"] = "image"
    source: str
    media_type: str | None = None
    provider_data: ProviderData = None

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str) -> ImageBlock:
        """Build an image block from raw bytes (e.g. ``Path('cat.png').read_bytes()``)."""
        return cls(source=base64.b64encode(data).decode("ascii"), media_type=media_type)

    @property
    def is_url(self) -> bool:
        """True for an http(s) URL (as opposed to inline data)."""
        return self.source.startswith(("http://", "https://"))

    def as_base64(self) -> tuple[str, str]:
        """``(media_type, base64 data)`` for inline images; raises ``ValueError`` for URLs."""
        if self.is_url:
            raise ValueError("this image is a URL, not inline data")
        if self.source.startswith("data:"):
            header, _, payload = self.source.partition(",")
            media = header[5:].split(";", 1)[0] or (self.media_type or "image/png")
            return media, payload
        return self.media_type or "image/png", self.source

    def as_data_url(self) -> str:
        """The image as a URL: http(s) URLs unchanged, inline data as a ``data:`` URL."""
        if self.is_url or self.source.startswith("data:"):
            return self.source
        media, payload = self.as_base64()
        return f"data:{media};base64,{payload}"


class ToolUseBlock(_Model):
    """The model asks to call tool ``name`` with ``arguments``. Arguments that are not a JSON
    object leave ``arguments`` ``{}``, ``raw_arguments`` what arrived and ``arguments_error`` what
    is wrong (a session answers that with an error result instead of calling the tool)."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None
    arguments_error: str | None = None
    provider_data: ProviderData = None


class ToolResultBlock(_Model):
    """The result of running a tool, sent back in a user turn: text, or text and image blocks."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool = False
    provider_data: ProviderData = None

    @property
    def text(self) -> str:
        """The result as one string; an image is a short ``[image media/type, N bytes]`` note."""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            b.text if isinstance(b, TextBlock) else _image_note(b) for b in self.content
        )

    @property
    def images(self) -> list[ImageBlock]:
        """The images in the result."""
        if isinstance(self.content, str):
            return []
        return [b for b in self.content if isinstance(b, ImageBlock)]


def _image_note(image: ImageBlock) -> str:
    if image.is_url:
        return f"[image {image.source}]"
    media_type, data = image.as_base64()
    return f"[image {media_type}, {len(data) * 3 // 4 - data[-2:].count('=')} bytes]"


class ThinkingBlock(_Model):
    """The model's visible reasoning. ``signature`` must be sent back byte-for-byte."""

    type: Literal["thinking"] = "thinking"
    thinking: str = ""
    signature: str | None = None
    provider_data: ProviderData = None


class RedactedThinkingBlock(_Model):
    """Reasoning the provider encrypted; ``data`` goes back verbatim."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str
    provider_data: ProviderData = None


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(_Model):
    """One conversation turn. ``content`` is a string or a list of blocks."""

    role: Literal["user", "assistant"]
    content: str | list[Block]

    def __init__(self, role: str | None = None, content: Any = None, /, **data: Any) -> None:
        if role is not None:
            data["role"] = role
        if content is not None:
            data["content"] = content
        super().__init__(**data)

    @property
    def blocks(self) -> list[Any]:
        """The content as a list of blocks (a string becomes one :class:`TextBlock`)."""
        if isinstance(self.content, str):
            return [TextBlock(text=self.content)] if self.content else []
        return list(self.content)

    @property
    def text(self) -> str:
        """The joined text of the message's text blocks."""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


class ToolDefinition(_Model):
    """A tool the model may call; ``parameters`` is a JSON Schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not v or len(v) > 64 or not all(c.isalnum() or c in "_-" for c in v):
            raise ValueError(
                f"tool name {v!r} must be 1-64 characters of letters, digits, '_' or '-'"
            )
        return v


class Usage(_Model):
    """Token counts. ``input_tokens`` never includes cache reads or writes (counted separately)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Everything the call consumed and produced."""
        return sum(getattr(self, name) for name in Usage.model_fields)

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{name: getattr(self, name) + getattr(other, name)
                        for name in Usage.model_fields})


class Response(_Model):
    """What a model answered. ``content`` holds every block in order (tool-use blocks included),
    empty when the model said nothing; ``tool_calls`` repeats the :class:`ToolUseBlock` s.
    ``parsed`` is the validated answer of a call made with ``output=``."""

    content: list[Block] = Field(default_factory=list)
    tool_calls: list[ToolUseBlock] = Field(default_factory=list)
    model: str = ""
    stop_reason: StopReason | None = None
    usage: Usage = Field(default_factory=Usage)
    provider_data: ProviderData = None
    parsed: Any = None
    #: what this answer cost (docs/cost.md): priced from ``usage`` when it arrived, kept as
    #: recorded when it is replayed; ``None`` when the price is unknown
    cost: Cost | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.parsed is None:
            data.pop("parsed", None)  # dumps of plain answers stay exactly as they were
        if self.cost is None:
            data.pop("cost", None)
        return data

    @property
    def text(self) -> str:
        """The joined text of the :class:`TextBlock` s (``""`` when there are none)."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def thinking(self) -> str:
        """The joined visible reasoning, if any."""
        return "".join(b.thinking for b in self.content if isinstance(b, ThinkingBlock))

    def to_message(self) -> Message:
        """The assistant turn to append to history: every block verbatim, signatures included."""
        return Message(role="assistant", content=[b.model_copy() for b in self.content])

    def deltas(self) -> list[StreamDelta]:
        """The deltas a stream of this answer yields, block by block (docs/sessions.md, "One event
        pipeline"): what a replayed call shows while it "streams"."""
        out: list[StreamDelta] = []
        for block in self.content:
            if isinstance(block, TextBlock) and block.text:
                out.append(StreamDelta(type="text_delta", text=block.text))
            elif isinstance(block, ThinkingBlock) and block.thinking:
                out.append(StreamDelta(type="thinking_delta", text=block.thinking))
            elif isinstance(block, ToolUseBlock):
                out.append(StreamDelta(type="tool_use_start", tool_call_id=block.id,
                                       tool_name=block.name))
                raw = (block.raw_arguments if block.arguments_error
                       else json.dumps(block.arguments))
                if raw:
                    out.append(StreamDelta(type="tool_use_delta", tool_call_id=block.id,
                                           tool_name=block.name, argument_delta=raw))
                out.append(StreamDelta(type="tool_use_end", tool_call_id=block.id,
                                       tool_name=block.name, arguments=block.arguments))
        return out

    def events(self) -> list[StreamDelta | MessageDoneEvent]:
        """This answer as a session stream's events: its :meth:`deltas`, then the
        ``MessageDoneEvent``."""
        return [*self.deltas(), MessageDoneEvent(response=self)]

    # Rich display (IPython calls these; nothing here imports IPython).
    def __str__(self) -> str:
        """The answer's text, so ``print(response)`` prints what the model said."""
        return self.text

    def _repr_markdown_(self) -> str:
        from .render import response_markdown

        return response_markdown(self)

    def _repr_html_(self) -> str | None:
        """HTML when markdown-it-py is installed; else None, so front ends render the Markdown
        (a raw ``<pre>`` fallback would outrank it in JupyterLab)."""
        from .render import markdown_to_html, response_markdown

        return markdown_to_html(response_markdown(self, for_html=True))

    def _repr_mimebundle_(
        self, include: Sequence[str] | None = None, exclude: Sequence[str] | None = None
    ) -> dict[str, Any]:
        from .render import response_markdown

        md = response_markdown(self)
        bundle: dict[str, Any] = {"text/markdown": md, "text/plain": self.text or md}
        if include:
            bundle = {k: v for k, v in bundle.items() if k in include}
        if exclude:
            bundle = {k: v for k, v in bundle.items() if k not in exclude}
        return bundle


class ModelInfo(_Model):
    """What a provider says about one of its models."""

    model_config = ConfigDict(extra="allow")

    id: str
    name: str = ""
    max_context_tokens: int | None = None
    supports_vision: bool = False
    supports_tool_use: bool = False
    supports_streaming: bool = True
    max_output_tokens: int | None = None
    vendor: str | None = None
    premium_multiplier: float | None = None
    endpoints: list[str] = Field(default_factory=list)


DeltaType = Literal[
    "text_delta", "thinking_delta", "tool_use_start", "tool_use_delta", "tool_use_end", "retry"
]


class StreamDelta(_Model):
    """One increment of a streamed answer.

    * ``text_delta`` / ``thinking_delta``: ``text`` holds the new text.
    * ``tool_use_start``: ``tool_call_id`` and ``tool_name``.
    * ``tool_use_delta``: ``argument_delta`` is the next fragment of the JSON arguments.
    * ``tool_use_end``: ``arguments`` holds the parsed arguments.
    * ``retry``: a :class:`RetryEvent` (no part of the answer).
    """

    type: DeltaType
    text: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    argument_delta: str | None = None
    arguments: dict[str, Any] | None = None


_object_new = object.__new__
_set_dict = object.__setattr__
#: pydantic's own slots, set directly (their descriptors: cheaper than ``object.__setattr__``)
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def text_delta(type: Literal["text_delta", "thinking_delta"], text: str) -> StreamDelta:
    """``StreamDelta(type=type, text=text)`` without validation, at a fraction of the cost (the
    hot path of every stream); only for a ``text`` that is a ``str``."""
    delta = _object_new(StreamDelta)
    _set_dict(delta, "__dict__", {"type": type, "text": text, "tool_call_id": None,
                                  "tool_name": None, "argument_delta": None, "arguments": None})
    _set_fields_set(delta, {"type", "text"})
    _set_extra(delta, None)
    _set_private(delta, None)
    return delta


class RetryEvent(StreamDelta):
    """A stream's event: the attempt failed before any output and is retried. ``attempt`` counts
    the retries from 1, ``wait`` is the seconds before it, ``reason`` says why (``"rate limited,
    HTTP 429"``). A :class:`StreamDelta` of type ``retry``: code that reads deltas by type passes
    it by."""

    type: Literal["retry"] = "retry"
    attempt: int = 1
    wait: float = 0.0
    reason: str = ""


class ToolResultEvent(_Model):
    """Session stream event: a tool ran (or failed) and this result goes back to the model."""

    type: Literal["tool_result"] = "tool_result"
    result: ToolResultBlock
    tool_name: str = ""
    duration: float = 0.0
    #: the approval decision when one was asked for: "approved", "approved (always)",
    #: "denied: reason" (None: the tool ran without asking)
    approval: str | None = None


class MessageDoneEvent(_Model):
    """Session stream event: one model turn finished; ``response`` carries usage and stop reason."""

    type: Literal["message_done"] = "message_done"
    response: Response


class ErrorEvent(_Model):
    """Session stream event: the turn failed; ``error`` is the exception (with ``partial``)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    type: Literal["error"] = "error"
    error: BaseException


StreamEvent = StreamDelta | ToolResultEvent | MessageDoneEvent | ErrorEvent


def as_messages(messages: str | Message | dict[str, Any] | Iterable[Any]) -> list[Message]:
    """Normalize what callers pass as ``messages``: a str is one user message; dicts are validated."""
    items = [messages] if isinstance(messages, (str, Message, dict)) else messages
    out: list[Message] = []
    for m in items:
        if isinstance(m, Message):
            out.append(m)
        elif isinstance(m, dict):
            out.append(Message.model_validate(m))
        elif isinstance(m, str):
            out.append(Message(role="user", content=m))
        else:
            raise TypeError(
                f"messages must be Message objects, dicts or strings, not {type(m).__name__}"
            )
    return out
