"""dispatch_nb: large language models from Jupyter, on a provider-agnostic adapter core.

``import dispatch_nb`` is cheap: the public names below are imported on first use, and nothing
here imports IPython, ipywidgets or a provider module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # types
    "TextBlock": "types",
    "ImageBlock": "types",
    "ToolUseBlock": "types",
    "ToolResultBlock": "types",
    "ThinkingBlock": "types",
    "RedactedThinkingBlock": "types",
    "Block": "types",
    "Message": "types",
    "ToolDefinition": "types",
    "Usage": "types",
    "Response": "types",
    "RetryEvent": "types",
    "StreamDelta": "types",
    "StreamEvent": "types",
    "ToolResultEvent": "types",
    "MessageDoneEvent": "types",
    "ErrorEvent": "types",
    "ModelInfo": "types",
    "StopReason": "types",
    # errors
    "DispatchError": "errors",
    "AuthenticationError": "errors",
    "RateLimitError": "errors",
    "ServerError": "errors",
    "RequestError": "errors",
    "ContextLengthError": "errors",
    "ModelUnavailableError": "errors",
    "APIConnectionError": "errors",
    "APITimeoutError": "errors",
    "RequestCancelled": "errors",
    "OutputValidationError": "errors",
    "BudgetExceededError": "errors",
    # structured output
    "StructuredOutput": "structured",
    "StructuredResponseStream": "structured",
    "AsyncStructuredResponseStream": "structured",
    # adapters and streams
    "Adapter": "adapter",
    "ChatRequest": "adapter",
    "ValidationResult": "adapter",
    "ResponseStream": "stream",
    "AsyncResponseStream": "stream",
    "CancelToken": "cancel",
    # registry
    "connect": "registry",
    "register_provider": "registry",
    "get_provider": "registry",
    "list_providers": "registry",
    # sessions and tools
    "Session": "session",
    "tool": "session",
    "Tool": "session",
    "SessionStream": "session",
    "AsyncSessionStream": "session",
    # record / replay
    "ResponseCache": "cache",
    "CachedAdapter": "cache",
    "CacheMissError": "cache",
    # prompts over data
    "batch": "batching",
    "abatch": "batching",
    "BatchResult": "batching",
    "BatchInterrupted": "batching",
    "BatchJob": "batching",
    "BatchPendingError": "batching",
    # concrete adapters (imported only when named)
    "CopilotAdapter": "providers.copilot",
    "OpenAIAdapter": "providers.openai",
    "AnthropicAdapter": "providers.anthropic",
    "LocalAdapter": "providers.local",
    "FakeAdapter": "testing",
    # what answers cost (docs/cost.md)
    "Cost": "cost",
    "CostTotal": "cost",
    "Estimate": "estimates",
    "Budget": "budget",
    "estimate": "estimates",
}

__all__ = sorted([*_EXPORTS, "load_ipython_extension", "unload_ipython_extension", "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dispatch_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext dispatch_nb``: register the ``%chat`` / ``%%chat`` magics."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext dispatch_nb``."""
    from .notebook.magics import unload_ipython_extension as unload

    unload(ipython)


if TYPE_CHECKING:
    from .adapter import Adapter, ChatRequest, ValidationResult
    from .batching import BatchInterrupted, BatchJob, BatchPendingError, BatchResult, abatch, batch
    from .cache import CachedAdapter, CacheMissError, ResponseCache
    from .cancel import CancelToken
    from .errors import (
        APIConnectionError,
        APITimeoutError,
        AuthenticationError,
        ContextLengthError,
        DispatchError,
        ModelUnavailableError,
        OutputValidationError,
        RateLimitError,
        RequestCancelled,
        RequestError,
        ServerError,
    )
    from .providers.anthropic import AnthropicAdapter
    from .providers.copilot import CopilotAdapter
    from .providers.local import LocalAdapter
    from .providers.openai import OpenAIAdapter
    from .registry import connect, get_provider, list_providers, register_provider
    from .session import AsyncSessionStream, Session, SessionStream, Tool, tool
    from .stream import AsyncResponseStream, ResponseStream
    from .structured import (
        AsyncStructuredResponseStream,
        StructuredOutput,
        StructuredResponseStream,
    )
    from .testing import FakeAdapter
    from .types import (
        Block,
        ErrorEvent,
        ImageBlock,
        Message,
        MessageDoneEvent,
        ModelInfo,
        RedactedThinkingBlock,
        Response,
        RetryEvent,
        StopReason,
        StreamDelta,
        StreamEvent,
        TextBlock,
        ThinkingBlock,
        ToolDefinition,
        ToolResultBlock,
        ToolResultEvent,
        ToolUseBlock,
        Usage,
    )
