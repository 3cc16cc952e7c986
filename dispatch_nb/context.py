"""The kernel as context, read-only: the ``list_variables`` and ``describe`` tools over named
variables (docs/tools.md, "The kernel as context")."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from .tools import Tool

__all__ = ["DEFAULT_MAX_BYTES", "context_tools", "describe_value", "session_context"]

#: most UTF-8 bytes one context tool call sends to the model
DEFAULT_MAX_BYTES = 4000
_ROWS = 5


def _clip(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    marker = "\n… (cut)"
    return data[: max_bytes - len(marker.encode())].decode("utf-8", "ignore") + marker


def describe_value(name: str, value: Any, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """A short, read-only description of ``value`` (never calls anything but reprs)."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    lines = [f"{name}: {kind}"]
    shape = getattr(value, "shape", None)
    if hasattr(value, "dtypes") and hasattr(value, "head") and hasattr(value, "describe"):
        lines.append(f"shape: {shape}")
        lines.append("dtypes:\n" + value.dtypes.to_string())
        lines.append(f"first {_ROWS} rows:\n" + value.head(_ROWS).to_string())
        try:
            lines.append("describe():\n" + value.describe().to_string())
        except Exception as exc:  # a frame pandas cannot summarise
            lines.append(f"describe() failed: {exc}")
    elif shape is not None and hasattr(value, "dtype"):
        lines.append(f"shape: {shape}")
        lines.append(f"dtype: {value.dtype}")
    else:
        with contextlib.suppress(Exception):  # no len(), or a len() that fails
            lines.append(f"len: {len(value)}")
        lines.append("repr: " + repr(value)[:max_bytes])
    return _clip("\n".join(lines), max_bytes)


def context_tools(
    namespace: Mapping[str, Any], names: Iterable[str], max_bytes: int = DEFAULT_MAX_BYTES
) -> list[Tool]:
    """The ``list_variables`` and ``describe`` tools over ``names`` of ``namespace``."""
    allowed = [n for n in dict.fromkeys(names) if n]
    if not allowed:
        raise ValueError("context (--context, context=) needs the names of variables the model "
                         "may read, e.g. 'df,orders'")

    def list_variables() -> str:
        """List the variables of the user's Python session you may read, with their types."""
        rows = [f"{n}: {type(namespace[n]).__name__}" for n in allowed if n in namespace]
        return _clip("\n".join(rows) or "(none of the allowed variables exist yet)", max_bytes)

    def describe(name: str) -> str:
        """Describe one variable of the user's Python session: its type; a DataFrame's shape,
        dtypes, first rows and summary statistics; an array's shape and dtype; else its repr.

        Args:
            name: The variable's name (one of those list_variables shows).
        """
        if name not in allowed:
            raise ValueError(
                f"{name!r} is not shared with you; you may read: {', '.join(allowed)}"
            )
        if name not in namespace:
            raise ValueError(f"{name!r} is not defined yet")
        return describe_value(name, namespace[name], max_bytes)

    return [Tool(list_variables), Tool(describe)]


def session_context(context: Any) -> list[Tool]:
    """The tools of ``Session(context=...)``: names (``"df,orders"`` or a list of names) of the
    IPython user namespace's variables, or a mapping ``{name: value}`` read instead."""
    if isinstance(context, Mapping):
        return context_tools(context, [str(name) for name in context])
    given = context.split(",") if isinstance(context, str) else (
        list(context) if isinstance(context, Iterable) else None)
    if given is None or not all(isinstance(n, str) for n in given):
        raise TypeError(
            "context= takes the names of variables the model may read ('df,orders' or "
            f"['df', 'orders']) or a mapping {{'df': df}}, not {type(context).__name__}"
        )
    ipython = sys.modules.get("IPython")  # a notebook or IPython has imported it
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        raise ValueError(
            "context= with names reads a notebook's (IPython's) variables; outside IPython "
            "pass the values: context={'df': df}"
        )
    return context_tools(shell.user_ns, [n.strip() for n in given])
