"""The checks of a ``%%chat`` line's options before anything is sent, shared by ``cell.py`` and
``each.py``: a bad value is a ``UsageError`` (shown without a traceback: a mistake in the magic's
line) saying what is accepted, and for a name that does not exist, the names that do.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import keyword
import typing
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from ..validation import article
from .display import magic_words

__all__ = ["check_limits", "check_output_name", "evaluate_option", "resolve_context", "resolve_schema",
           "resolve_tools"]


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


TOOLS_ACCEPTED = (
    "--tools takes functions from the namespace, with type hints or decorated with @tool"
)


def _defined_here(namespace: dict[str, Any], kind: str, fits: Callable[[Any], bool]) -> str:
    """`` Kinds defined here: a, b.`` (``kind`` plural) for the names whose value ``fits``, or
    that none is yet."""
    names = sorted(n for n, value in namespace.items() if not n.startswith("_") and fits(value))
    return f" {kind.capitalize()} defined here: {', '.join(names)}." if names \
        else f" No {kind} are defined here yet."


def _notebooks(value: Any) -> bool:
    """Defined in the notebook (``__main__``), not imported (``BaseModel``, ``print``)."""
    return getattr(value, "__module__", None) == "__main__"


def _did_you_mean(name: str, namespace: dict[str, Any]) -> str:
    close = difflib.get_close_matches(name, [n for n in namespace if not n.startswith("_")], n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def resolve_tools(names: str | None, namespace: dict[str, Any]) -> list[Any]:
    """``--tools f,g`` → tool objects from the namespace (``@tool`` objects or typed functions);
    a name that is none is a ``UsageError`` naming the functions defined here."""
    if not names:
        return []
    from ..tools import Tool, tool  # only for --tools

    def functions() -> str:
        return _defined_here(namespace, "functions", lambda value: isinstance(value, Tool) or (
            inspect.isfunction(value) and _notebooks(value)))

    out: list[Any] = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in namespace:
            raise UsageError(f"--tools {name}: there is no {name!r} in the namespace"
                             f"{_did_you_mean(name, namespace)}.{functions()} {TOOLS_ACCEPTED}.")
        obj = namespace[name]
        if isinstance(obj, Tool):
            out.append(obj)
        elif callable(obj):
            try:
                out.append(tool(obj))
            except (TypeError, ValueError) as exc:
                raise UsageError(f"--tools {name}: {exc}. Add type hints, or use @tool.") from None
        else:
            raise UsageError(f"--tools {name}: {name} is {article(type(obj).__name__)}, not a "
                             f"function.{functions()} {TOOLS_ACCEPTED}.")
    return out


def resolve_context(names: str | None, namespace: dict[str, Any]) -> list[Any]:
    """``--context a,b`` → the read-only tools over those variables; a name the namespace does
    not have is a ``UsageError``, as a wrong ``--tools`` name is (else the model reads nothing)."""
    if not names:
        return []
    from ..context import context_tools  # only for --context

    wanted = [n.strip() for n in names.split(",")]
    for name in wanted:
        if name and name not in namespace:
            raise UsageError(f"--context {name}: there is no {name!r} in the namespace"
                             f"{_did_you_mean(name, namespace)}; --context takes the names of "
                             "variables the model may read.")
    try:
        return context_tools(namespace, wanted)
    except ValueError as exc:  # no name given
        raise UsageError(f"--context {names}: {exc}") from None


def _is_schema(value: Any) -> bool:
    """A class ``--schema`` takes: a pydantic model, a dataclass or a TypedDict."""
    from pydantic import BaseModel

    return isinstance(value, type) and _notebooks(value) and (
        issubclass(value, BaseModel) or dataclasses.is_dataclass(value)
        or typing.is_typeddict(value))


def evaluate_option(
    option: str, expression: str, namespace: dict[str, Any], accepted: str,
    defined: Callable[[], str] = str,
) -> tuple[str, Any]:
    """``option NAME`` → ``(NAME stripped, its value)``: ``NAME`` may be an expression, evaluated
    in the namespace; none, a missing name or a failing expression is a ``UsageError`` that ends
    with ``accepted`` (what the option takes); a missing name also says ``defined()`` (the names
    that would do)."""
    expression = expression.strip()
    if not expression:
        raise UsageError(f"{option} needs a name: {accepted}")
    try:
        value = eval(expression, namespace)  # the user's own expression, in their kernel
    except NameError as exc:
        missing = getattr(exc, "name", None)
        guess = _did_you_mean(missing, namespace) if missing else ""
        head = expression.split("[", 1)[0].strip()
        try:  # df[name]: the quotes of df['name'] were dropped; list[Review]: a missing class
            indexed = "[" in expression and not isinstance(eval(head, namespace), type)
        except Exception:
            indexed = False
        quotes = (f" The option line is split as a shell splits it, which drops quotes: put the "
                  f'expression in double quotes ({option} "df[\'name\']").' if indexed else "")
        raise UsageError(f"{option} {expression}: {exc}{guess}.{quotes}{defined()} {accepted}.") \
            from None
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
    def schemas() -> str:
        return _defined_here(namespace, "schemas", _is_schema)

    expression, value = evaluate_option("--schema", expression, namespace, SCHEMA_ACCEPTED, schemas)
    from ..structured import StructuredOutput, as_output  # only for --schema

    if not (isinstance(value, (type, dict, StructuredOutput)) or typing.get_origin(value) is not None):
        raise UsageError(
            f"--schema {expression} is {article(type(value).__name__)}, not a schema.{schemas()} "
            f"{SCHEMA_ACCEPTED}."
        )
    try:
        return as_output(value)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--schema {expression}: {magic_words(str(exc))}. {SCHEMA_ACCEPTED}.") from None
