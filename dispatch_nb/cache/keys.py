"""Cache keys and secret scrubbing: what identifies a request, and what is never written
(docs/record-replay.md, "What makes two requests the same", "Secrets are never recorded").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from ..adapter import ChatRequest
from ..errors import REDACTED, redact, redact_pieces
from ..types import ToolDefinition

__all__ = ["FORMAT_VERSION", "REDACTED", "cache_key", "scrub_secrets", "secret_env_names"]

#: the version of the cache's key material and file lines
FORMAT_VERSION = 1
#: options that do not change the answer (and may hold secrets): left out of the key
_KEY_IGNORED_OPTIONS = frozenset({"max_retries", "extra_headers"})


# -- keys -----------------------------------------------------------------------------------------
def cache_key(provider: str, model: str, request: ChatRequest) -> str:
    """The hex SHA-256 key of a request: the same on every run, machine and Python version.

    A ``str`` message and a message holding one equal ``TextBlock`` have the same key.
    """
    messages = [
        {
            "role": m.role,
            "content": [b.model_dump(mode="json", exclude_none=True) for b in m.blocks],
        }
        for m in request.messages
    ]
    tools = [
        t.model_dump(mode="json") if isinstance(t, ToolDefinition) else t for t in request.tools
    ]
    options = {k: v for k, v in request.options.items() if k not in _KEY_IGNORED_OPTIONS}
    material = {
        "v": FORMAT_VERSION,
        "provider": provider,
        "model": model,
        "system": request.system,
        "tools": tools,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "options": options,
        "messages": messages,
    }
    if request.output is not None:  # structured output (absent otherwise: older keys unchanged)
        material["output"] = request.output.key_material()
    canonical = json.dumps(material, sort_keys=True, ensure_ascii=True, separators=(",", ":"),
                           allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


# -- secrets --------------------------------------------------------------------------------------
#: environment variables always scrubbed, whatever is registered; every registered provider's
#: ``key_env`` and ``secret_env`` (its :class:`~dispatch_nb.registry.ProviderDescriptor`) too
_SECRET_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DISPATCH_NB_GITHUB_TOKEN", "GITHUB_TOKEN",
               "GH_TOKEN", "COPILOT_API_KEY")


def secret_env_names() -> list[str]:
    """The environment variables whose values a cache never writes."""
    from ..registry import list_descriptors

    return list(dict.fromkeys([*_SECRET_ENV, *(name for descriptor in list_descriptors()
                                                for name in descriptor.secret_env_names)]))


_SECRET_ATTR = re.compile(r"(?i)(api_?key|token|secret|password|authorization)")
_MIN_SECRET = 8


#: fields holding opaque provider data (signatures, encrypted reasoning): a base64 blob can contain
#: "-sk-…" by chance, so only exact known secret values are replaced there, never patterns
_OPAQUE_KEYS = frozenset({"signature", "encrypted_content", "data", "provider_data",
                          "reasoning_opaque"})


def scrub_secrets(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (str, list, dict, nested) with every secret-looking string and every value in
    ``secrets`` replaced by ``[REDACTED]`` (in a line's ``deltas``, also a secret streamed in
    pieces: each text they stream is scanned whole). Dict keys are scrubbed too. Inside opaque fields
    (signatures, encrypted reasoning, ``provider_data``) only the exact ``secrets`` are replaced,
    so a replayed signature stays byte-for-byte what the provider issued."""
    known = [s for s in secrets if s and len(s) >= _MIN_SECRET]

    def walk(v: Any, opaque: bool) -> Any:
        if isinstance(v, str):
            return redact(v, known, patterns=not opaque)
        if isinstance(v, dict) and isinstance(v.get("deltas"), list):
            # each streamed text scanned whole; its pieces are not scanned one by one again
            # (a pattern's word boundary differs in a piece: they would no longer add up)
            done = [{k: x if k == _PIECE_FIELDS.get(d.get("type") or "") else walk(x, opaque)
                     for k, x in d.items()} if isinstance(d, dict) else walk(d, opaque)
                    for d in _across_deltas(v["deltas"], known)]
            return {**{k: walk(x, opaque) for k, x in v.items() if k != "deltas"}, "deltas": done}
        if isinstance(v, dict):
            return {
                (walk(k, opaque) if isinstance(k, str) else k):
                    walk(x, opaque or (isinstance(k, str) and k in _OPAQUE_KEYS))
                for k, x in v.items()
            }
        if isinstance(v, (list, tuple)):
            return [walk(x, opaque) for x in v]
        return v

    return walk(value, False)


#: the field of each kind of recorded delta that holds a piece of a longer text
_PIECE_FIELDS = {"text_delta": "text", "thinking_delta": "text", "tool_use_delta": "argument_delta"}


def _across_deltas(deltas: list[Any], known: list[str]) -> list[Any]:
    """Recorded deltas with the secrets of each text they stream (the answer, the thinking, each
    tool call's arguments) replaced across their boundaries: a key the model repeats streams in
    pieces that no piece holds whole."""
    texts: dict[tuple[str, Any], list[int]] = {}
    tool = None
    for i, delta in enumerate(deltas):
        kind = delta.get("type") if isinstance(delta, dict) else None
        if kind == "tool_use_start":
            tool = delta.get("tool_call_id")
        field = _PIECE_FIELDS.get(kind or "")
        if field and isinstance(delta.get(field), str):  # a call's pieces: by its id, if given
            owner = (delta.get("tool_call_id") or tool) if kind == "tool_use_delta" else kind
            texts.setdefault((field, owner), []).append(i)
    out = list(deltas)
    for (field, _), places in texts.items():
        pieces = redact_pieces([out[i][field] for i in places], known)
        for i, piece in zip(places, pieces, strict=True):
            out[i] = {**out[i], field: piece}
    return out


def _adapter_secrets(adapter: Any, depth: int = 2) -> set[str]:
    """String attributes named like keys/tokens on the adapter (and objects it holds)."""
    found: set[str] = set()
    seen: set[int] = set()

    def visit(obj: Any, level: int) -> None:
        if id(obj) in seen or level < 0:
            return
        seen.add(id(obj))
        try:
            attrs = vars(obj)
        except TypeError:
            return
        for name, value in attrs.items():
            if isinstance(value, str):
                if _SECRET_ATTR.search(name) and len(value) >= _MIN_SECRET:
                    found.add(value)
            elif type(value).__module__.startswith("dispatch_nb"):
                visit(value, level - 1)

    visit(adapter, depth)
    return found

