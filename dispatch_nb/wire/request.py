"""What a wire format is given: one call, normalized (:class:`ChatRequest`), and the output-mode
helpers every provider and format shares. ``output=`` is read as :class:`OutputSpec`, which
:class:`~dispatch_nb.structured.StructuredOutput` (a layer above) provides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..types import Message, ToolDefinition

__all__ = [
    "OUTPUT_MODES",
    "OUTPUT_TOOL_NAME",
    "ChatRequest",
    "OutputSpec",
    "output_tool_choice",
    "requested_mode",
    "unsupported_mode",
]

#: the name of the tool whose arguments are the answer in ``tool`` mode
OUTPUT_TOOL_NAME = "final_answer"
#: what ``StructuredOutput(mode=...)`` and ``adapter.structured_output`` accept
OUTPUT_MODES: tuple[str, ...] = ("auto", "native", "tool", "json_object", "prompt")


class OutputSpec(Protocol):
    """What a wire format reads of ``output=`` (a
    :class:`~dispatch_nb.structured.StructuredOutput`)."""

    name: str
    description: str | None
    #: the JSON Schema sent (an object at the root)
    schema: dict[str, Any]
    #: OpenAI strict mode: None when it can be, False never, True or fail
    strict: bool | None
    mode: str

    def tool_definition(self) -> ToolDefinition: ...

    def tool_instructions(self) -> str: ...


@dataclass
class ChatRequest:
    """One call, normalized: what a provider module turns into its wire format."""

    messages: list[Message]
    system: str | None = None
    tools: list[ToolDefinition | dict[str, Any]] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    #: what ``output=`` asked for: a :class:`~dispatch_nb.structured.StructuredOutput`, of which
    #: the wire formats read the :class:`OutputSpec` part (typed ``Any`` here: the class lives a
    #: layer above, and structured output reads the rest of it)
    output: Any = None

    @property
    def function_tools(self) -> list[ToolDefinition]:
        """Tools defined by name/description/parameters."""
        return [t for t in self.tools if isinstance(t, ToolDefinition)]

    @property
    def native_tools(self) -> list[dict[str, Any]]:
        """Provider built-in tools passed as raw dicts (e.g. ``{"type": "web_search"}``)."""
        return [t for t in self.tools if isinstance(t, dict)]


class _Named(Protocol):
    @property
    def display_name(self) -> str: ...


def requested_mode(adapter: object, request: ChatRequest) -> str:
    """The mechanism asked for: the call's ``StructuredOutput(mode=...)``, else the adapter's
    ``structured_output``; ``auto`` lets the provider choose."""
    assert request.output is not None
    mode: str = request.output.mode
    if mode == "auto":
        mode = getattr(adapter, "structured_output", "auto") or "auto"
        if mode not in OUTPUT_MODES:
            raise ValueError(f"structured_output must be one of {', '.join(OUTPUT_MODES)}, "
                             f"not {mode!r}")
    return mode


def unsupported_mode(adapter: _Named, mode: str, supported: tuple[str, ...]) -> ValueError:
    """The error for a mechanism this provider cannot use."""
    return ValueError(
        f"{adapter.display_name} cannot use structured output mode {mode!r}; use one of "
        f"{', '.join(supported)} (auto picks one per model)"
    )


def output_tool_choice(request: ChatRequest, *, can_force: bool = True) -> Any:
    """The neutral ``tool_choice`` for ``tool`` mode: the output tool by name when it is the
    only tool, ``"required"`` with other tools (the model calls them, then the output tool),
    ``"auto"`` when a forced choice is not allowed (Anthropic with thinking); the caller's own
    ``tool_choice`` wins."""
    given = request.options.get("tool_choice")
    if given is not None:
        return given
    if not can_force:
        return "auto"
    others = request.function_tools
    if any(t.name == OUTPUT_TOOL_NAME for t in others):
        raise ValueError(f"a tool is named {OUTPUT_TOOL_NAME!r}, the name structured output "
                         "uses in tool mode; rename it")
    return "required" if others or request.native_tools else OUTPUT_TOOL_NAME
