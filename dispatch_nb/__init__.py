"""dispatch_nb: large language models from Jupyter, on a provider-agnostic adapter core.

``import dispatch_nb`` is cheap: the public names below are imported on first use, and nothing
here imports IPython, ipywidgets or a provider module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: each public name's module, imported on first use (the TYPE_CHECKING imports below name them too)
_MODULES: dict[str, str] = {
    "types": "TextBlock ImageBlock ToolUseBlock ToolResultBlock ThinkingBlock RedactedThinkingBlock "
    "Block Message ToolDefinition Usage Response RetryEvent StreamDelta StreamEvent ToolResultEvent "
    "MessageDoneEvent ErrorEvent ModelInfo StopReason",
    "errors": "DispatchError AuthenticationError RateLimitError ServerError RequestError "
    "ContextLengthError ModelUnavailableError APIConnectionError APITimeoutError RequestCancelled "
    "OutputValidationError BudgetExceededError",
    "structured": "StructuredOutput StructuredResponseStream AsyncStructuredResponseStream",
    "adapter": "Adapter ChatRequest ValidationResult",
    "stream": "ResponseStream AsyncResponseStream",
    "cancel": "CancelToken",
    "registry": "connect register_provider get_provider list_providers",
    "session": "Session tool Tool SessionStream AsyncSessionStream",
    "cache": "ResponseCache CachedAdapter CacheMissError",
    "batching": "batch abatch BatchResult BatchInterrupted BatchJob BatchPendingError",
    "providers.copilot": "CopilotAdapter",
    "providers.openai": "OpenAIAdapter",
    "providers.anthropic": "AnthropicAdapter",
    "providers.local": "LocalAdapter",
    "testing": "FakeAdapter",
    "cost": "Cost CostTotal",
    "estimates": "Estimate estimate",
    "budget": "Budget",
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names.split()}

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
    from .budget import Budget
    from .cache import CachedAdapter, CacheMissError, ResponseCache
    from .cancel import CancelToken
    from .cost import Cost, CostTotal
    from .errors import (
        APIConnectionError,
        APITimeoutError,
        AuthenticationError,
        BudgetExceededError,
        ContextLengthError,
        DispatchError,
        ModelUnavailableError,
        OutputValidationError,
        RateLimitError,
        RequestCancelled,
        RequestError,
        ServerError,
    )
    from .estimates import Estimate, estimate
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
