"""The checks of a ``%%chat`` line's options before anything is sent, shared by ``cell.py`` and
``each.py``: a bad value is a ``UsageError`` (a tool's: a :class:`ChatError`) saying what is accepted.
"""

from __future__ import annotations

import argparse
import keyword
import typing
from typing import Any

from IPython.core.error import UsageError

from ..validation import article
from .display import ChatError, magic_words

__all__ = ["check_limits", "check_output_name", "evaluate_option", "resolve_schema", "resolve_tools"]


SCHEMA_ACCEPTED = (
    "--schema takes a pydantic model class, a type such as list[Review], a TypedDict or a "
    "dataclass, or a JSON Schema dict, from the namespace"
)


def check_output_name(name: str | None) -> None:
    """``-o VAR`` must name a Python variable."""
    if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
        raise UsageError(
            f"-o needs a Python variable name (letters, digits and _, not starting with a digit), "
            f"not {name!r}"
        )


def check_limits(args: argparse.Namespace) -> None:
    """``--temperature`` within 0..2, ``--max-tokens`` positive."""
    if args.temperature is not None and not 0 <= args.temperature <= 2:
        raise UsageError(f"--temperature must be between 0 and 2, not {args.temperature}")
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise UsageError(f"--max-tokens must be a positive integer, not {args.max_tokens}")


def resolve_tools(names: str | None, namespace: dict[str, Any]) -> list[Any]:
    """``--tools f,g`` → tool objects from the namespace (``@tool`` objects or typed functions)."""
    if not names:
        return []
    from ..tools import Tool, tool  # only for --tools

    out: list[Any] = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in namespace:
            raise ChatError(
                "Unknown tool", f"there is no {name!r} in the namespace", "Define the function first."
            )
        obj = namespace[name]
        if isinstance(obj, Tool):
            out.append(obj)
        elif callable(obj):
            try:
                out.append(tool(obj))
            except (TypeError, ValueError) as exc:
                raise ChatError("Tool error", f"{name}: {exc}", "Add type hints, or use @tool.") from None
        else:
            raise ChatError("Tool error", f"{name} is {article(type(obj).__name__)}, not a function")
    return out


def evaluate_option(
    option: str, expression: str, namespace: dict[str, Any], accepted: str
) -> tuple[str, Any]:
    """``option NAME`` → ``(NAME stripped, its value)``: ``NAME`` may be an expression, evaluated
    in the namespace; none, a missing name or a failing expression is a ``UsageError`` that ends
    with ``accepted`` (what the option takes)."""
    expression = expression.strip()
    if not expression:
        raise UsageError(f"{option} needs a name: {accepted}")
    try:
        value = eval(expression, namespace)  # the user's own expression, in their kernel
    except NameError as exc:
        head = expression.split("[", 1)[0].strip()
        try:  # df[name]: the quotes of df['name'] were dropped; list[Review]: a missing class
            indexed = "[" in expression and not isinstance(eval(head, namespace), type)
        except Exception:
            indexed = False
        quotes = (f" The option line is split as a shell splits it, which drops quotes: put the "
                  f'expression in double quotes ({option} "df[\'name\']").' if indexed else "")
        raise UsageError(f"{option} {expression}: {exc}.{quotes} {accepted}.") from None
    except Exception as exc:
        raise UsageError(
            f"{option} {expression} could not be evaluated ({type(exc).__name__}: {exc}). "
            f"{accepted}."
        ) from None
    return expression, value


def resolve_schema(expression: str | None, namespace: dict[str, Any]) -> Any:
    """``--schema NAME`` → a checked :class:`~dispatch_nb.structured.StructuredOutput` (None without
    it); ``NAME`` may be an expression (``list[Review]``); a bad one is a ``UsageError``."""
    if expression is None:
        return None
    expression, value = evaluate_option("--schema", expression, namespace, SCHEMA_ACCEPTED)
    from ..structured import StructuredOutput, as_output  # only for --schema

    if not (isinstance(value, (type, dict, StructuredOutput)) or typing.get_origin(value) is not None):
        raise UsageError(
            f"--schema {expression} is {article(type(value).__name__)}, not a schema. "
            f"{SCHEMA_ACCEPTED}."
        )
    try:
        return as_output(value)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--schema {expression}: {magic_words(str(exc))}. {SCHEMA_ACCEPTED}.") from None
