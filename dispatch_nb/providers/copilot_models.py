"""GitHub Copilot's model catalogue, sans-I/O: what ``GET /models`` says about each model (which
the pickers show, its route, limits and vendor); the approximate context windows used while the
list is unknown."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from ..types import ModelInfo

__all__ = [
    "FALLBACK_CONTEXT_TOKENS",
    "Route",
    "copilot_endpoint",
    "copilot_model_info",
    "fallback_context_tokens",
    "find_entry",
    "is_openai_model",
    "is_picker_model",
    "model_entries",
    "output_limit",
    "picker_models",
]

#: while the model list is unknown (offline, or before the first call).
FALLBACK_CONTEXT_TOKENS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 128_000),
    ("gpt-4o", 128_000),
    ("gpt-5", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude", 200_000),
    ("gemini", 128_000),
    ("grok", 128_000),
)

#: where a model is spoken to, relative to the Copilot API
Route = Literal["chat/completions", "responses"]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if value > 0 else None


def output_limit(entry: Mapping[str, Any] | None) -> int | None:
    """The model's ``capabilities.limits.max_output_tokens`` (None when unknown)."""
    limits = _dict(_dict(_dict(entry).get("capabilities")).get("limits"))
    return _int(limits.get("max_output_tokens"))


def is_picker_model(entry: Mapping[str, Any]) -> bool:
    """Whether editors show this ``/models`` entry in their model picker (zed's and
    CopilotChat.nvim's rule): ``model_picker_enabled``, ``capabilities.type == "chat"``, and a
    ``policy`` that is absent or ``enabled``."""
    if entry.get("model_picker_enabled") is not True:
        return False
    if _dict(entry.get("capabilities")).get("type") != "chat":
        return False
    policy = entry.get("policy")
    return policy is None or _dict(policy).get("state") == "enabled"


def copilot_model_info(entry: Mapping[str, Any]) -> ModelInfo | None:
    """One ``GET /models`` entry → :class:`ModelInfo` (None for an entry without an id).

    ``max_context_tokens`` is ``limits.max_context_window_tokens``; ``premium_multiplier`` is
    ``billing.multiplier`` (0 for models that cost no premium requests); ``endpoints`` is
    ``supported_endpoints``. Extras: ``max_prompt_tokens``, ``family``, ``preview``,
    ``model_picker_enabled``, ``policy_state``, ``supports_thinking``, ``reasoning_effort``.
    """
    model_id = entry.get("id")
    if not isinstance(model_id, str) or not model_id:
        return None
    caps = _dict(entry.get("capabilities"))
    limits = _dict(caps.get("limits"))
    supports = _dict(caps.get("supports"))
    billing = _dict(entry.get("billing"))
    prompt = _int(limits.get("max_prompt_tokens"))
    output = _int(limits.get("max_output_tokens"))
    context = _int(limits.get("max_context_window_tokens"))
    if context is None and prompt is not None:
        context = prompt + (output or 0)
    multiplier: float | None = None
    raw_multiplier = billing.get("multiplier")
    if isinstance(raw_multiplier, (int, float)) and not isinstance(raw_multiplier, bool):
        multiplier = float(raw_multiplier)
    elif billing.get("is_premium") is False:
        multiplier = 0.0
    endpoints = [e for e in entry.get("supported_endpoints") or [] if isinstance(e, str)]
    extra: dict[str, Any] = {
        "max_prompt_tokens": prompt,
        "family": caps.get("family") if isinstance(caps.get("family"), str) else None,
        "preview": bool(entry.get("preview", False)),
        "model_picker_enabled": bool(entry.get("model_picker_enabled", False)),
        "policy_state": _dict(entry.get("policy")).get("state"),
        "supports_thinking": bool(supports.get("thinking", False)),
    }
    effort = supports.get("reasoning_effort")
    if isinstance(effort, list):
        extra["reasoning_effort"] = [e for e in effort if isinstance(e, str)]
    vendor = entry.get("vendor")
    name = entry.get("name")
    return ModelInfo(
        id=model_id,
        name=name if isinstance(name, str) and name else model_id,
        max_context_tokens=context,
        supports_vision=bool(supports.get("vision", False)),
        supports_tool_use=bool(supports.get("tool_calls", False)),
        supports_streaming=bool(supports.get("streaming", True)),
        max_output_tokens=output,
        vendor=vendor if isinstance(vendor, str) else None,
        premium_multiplier=multiplier,
        endpoints=endpoints,
        **extra,
    )


def copilot_endpoint(entry: Mapping[str, Any] | None, model: str) -> Route:
    """Where a model is spoken to: ``responses`` when its ``supported_endpoints`` list
    ``/responses`` but not ``/chat/completions`` (VS Code's rule), else ``chat/completions``.
    Without an entry (the model list is unavailable) Codex models go to ``responses``."""
    if entry is None:
        return "responses" if "codex" in model.lower() else "chat/completions"
    endpoints = entry.get("supported_endpoints")
    if (
        isinstance(endpoints, list)
        and "/chat/completions" not in endpoints
        and "/responses" in endpoints
    ):
        return "responses"
    return "chat/completions"


def fallback_context_tokens(model: str) -> int | None:
    """The built-in, approximate context window for ``model`` (None when unknown)."""
    name = model.lower()
    return next((tokens for prefix, tokens in FALLBACK_CONTEXT_TOKENS if name.startswith(prefix)), None)


def is_openai_model(entry: Mapping[str, Any] | None, model: str) -> bool:
    """Whether ``model`` is one of OpenAI's: its entry's ``vendor``, else its name."""
    vendor = _dict(entry).get("vendor")
    if isinstance(vendor, str) and vendor:
        return vendor.lower() in ("openai", "azure openai")
    return model.lower().startswith(("gpt-", "o1", "o3", "o4", "chatgpt-"))


def model_entries(body: Any) -> list[dict[str, Any]]:
    """The entries of a ``GET /models`` answer (``{"data": [...]}`` or a bare list) that have an
    id, copied."""
    data = body.get("data") if isinstance(body, dict) else body
    return [dict(e) for e in data or [] if isinstance(e, dict) and isinstance(e.get("id"), str)]


def find_entry(entries: Iterable[dict[str, Any]], model: str) -> dict[str, Any] | None:
    return next((e for e in entries if e.get("id") == model), None)


def picker_models(entries: Sequence[Mapping[str, Any]]) -> list[ModelInfo]:
    """The models the editors' pickers show, once each, in list order."""
    out: dict[str, ModelInfo] = {}
    for entry in entries:
        if is_picker_model(entry) and entry["id"] not in out:
            info = copilot_model_info(entry)
            if info is not None:
                out[info.id] = info
    return list(out.values())
