"""Rows in, prompts out: reading a batch's input lazily and filling the template for each row
(docs/batch.md, "Rows and the template"; pandas is duck-typed, never imported here).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..adapter import normalize_tools
from ..cache.keys import _KEY_IGNORED_OPTIONS
from ..types import Message, ToolDefinition

__all__ = ["RowCall", "RowSource", "TemplateError", "fill_template", "row_key"]


class TemplateError(ValueError):
    """The template cannot be filled from the rows (e.g. it names a column the rows lack)."""


# -- input ----------------------------------------------------------------------------------------
def _is_dataframe(value: Any) -> bool:
    return (
        hasattr(value, "columns")
        and callable(getattr(value, "itertuples", None))
        and hasattr(value, "iloc")
    )


def _is_series(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    return (
        isinstance(shape, tuple)
        and len(shape) == 1
        and hasattr(value, "iloc")
        and hasattr(value, "index")
        and not hasattr(value, "columns")
    )


class RowSource:
    """The rows of a batch, read lazily: ``iter(source)`` yields ``(position, row)``; ``total``
    and ``kept`` (the input, for :meth:`BatchResult.to_pandas`) only for an input in memory."""

    def __init__(self, rows: Any, namespace: Mapping[str, Any] | None = None) -> None:
        if isinstance(rows, (str, bytes)):
            raise TypeError(
                "rows must be a list (or other iterable) of rows, a DataFrame or a Series, not a "
                "single string; for one prompt use chat(), or pass [text]"
            )
        if isinstance(rows, Mapping):
            raise TypeError(
                "rows must be a list of rows; got one mapping. Pass [row] for one row, or a "
                "DataFrame / list of dicts for a table"
            )
        self.name: str | None = None
        self.index: Any = None
        self.columns: list[Any] = []
        self.total: int | None = None
        self.kept: Any = None
        if _is_dataframe(rows):
            self.kind = "dataframe"
            self.index = rows.index
            self.columns = list(rows.columns)
        elif _is_series(rows):
            self.kind = "series"
            self.index = rows.index
            name = getattr(rows, "name", None)
            self.name = name if isinstance(name, str) and name.isidentifier() else None
        elif isinstance(rows, Sequence):
            self.kind = "sequence"
        elif isinstance(rows, Iterable):
            self.kind = "iterable"
        else:
            raise TypeError(
                f"rows must be a list of str or dicts, a DataFrame, a Series or any iterable, "
                f"not {type(rows).__name__}"
            )
        if self.kind != "iterable":  # in memory already: sized, and kept for to_pandas
            self.total, self.kept = len(rows), rows
        self._rows = rows
        #: names every row's template may use besides the row's own (e.g. a notebook's variables)
        self.extra: dict[str, Any] = dict(namespace or {})

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        if self.kind == "dataframe":
            for position, values in enumerate(self._rows.itertuples(index=False, name=None)):
                yield position, dict(zip(self.columns, values, strict=True))
        else:
            yield from enumerate(self._rows)

    def namespace(self, row: Any) -> dict[str, Any]:
        """The names a template sees for ``row``: the extra names, then the row's own (which win)."""
        names = dict(self.extra)
        if isinstance(row, Mapping):
            names.update({str(k): v for k, v in row.items()})
            if "row" not in row:
                names["row"] = row
            return names
        names["row"] = row
        if self.name is not None:
            names[self.name] = row
        return names


# -- templates ------------------------------------------------------------------------------------
def _undefined(notes: list[str]) -> list[str]:
    # build_prompt leaves an expression naming something undefined as written, with a note that
    # quotes Python's NameError ("name 'x' is not defined")
    return [n for n in notes if "is not defined" in n]


def fill_template(template: str | Callable[[Any], Any], row: Any,
                  names: Mapping[str, Any]) -> str | list[Message]:
    """``template`` (a str filled by ``%%chat``'s rules, or a function) filled for one row;
    :class:`TemplateError` when it names something the row lacks or an expression fails."""
    if callable(template):
        value = template(row)
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)) and all(isinstance(m, (Message, dict)) for m in value):
            return [m if isinstance(m, Message) else Message.model_validate(m) for m in value]
        raise TemplateError(
            f"a template function must return a str or a list of messages, not "
            f"{type(value).__name__}"
        )
    from ..prompting import PromptError, build_prompt

    try:
        prompt = build_prompt(template, names)
    except PromptError as exc:
        raise TemplateError(str(exc)) from None
    missing = _undefined(prompt.notes)
    if missing:
        available = ", ".join(sorted(k for k in names if k != "row")) or "none: use {row}"
        raise TemplateError(
            f"{missing[0].split(' was left')[0]} names nothing in this row (its names: "
            f"{available}; {{row}} is the whole row). Write {{{{ and }}}} for literal braces."
        )
    return prompt.text


# -- what every row sends, and keys -----------------------------------------------------------------
@dataclass
class RowCall:
    """What every row's call carries besides its prompt: ``system``, ``tools`` and the request
    ``options`` (each reaches every call and every row's key); ``stream`` is not part of the key
    (a streamed and a plain answer are the same answer)."""

    system: str | None = None
    tools: list[Any] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    stream: bool = False

    @property
    def runs_tools(self) -> bool:
        """Whether a row runs the tool loop (some tool has a Python handler)."""
        return any(not isinstance(t, (ToolDefinition, dict)) for t in self.tools)

    def key_material(self) -> dict[str, Any]:
        """The JSON of everything besides the prompt and the model that shapes an answer."""
        tools = [
            t.model_dump(mode="json") if isinstance(t, ToolDefinition) else t
            for t in normalize_tools(self.tools)
        ]
        options = {
            k: _jsonable(v) for k, v in sorted(self.options.items())
            if k not in _KEY_IGNORED_OPTIONS
        }
        return {"system": self.system, "tools": tools, "options": options}


def _jsonable(value: Any) -> Any:
    key_material = getattr(value, "key_material", None)  # a StructuredOutput (output=)
    if callable(key_material) and not isinstance(value, type):
        return key_material()
    dump = getattr(value, "model_json_schema", None)  # a pydantic model class (output=)
    if callable(dump) and isinstance(value, type):
        return {"pydantic": value.__qualname__, "schema": dump()}
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def row_key(model: str, messages: str | list[Message], call_material: Mapping[str, Any]) -> str:
    """The key of a row's request: SHA-256 of the model (``provider:model``), the filled prompt
    and the request options (:meth:`.BatchPlan.keyed` adds ``#n`` to the ``n``-th repeat of
    a request in one input, so repeated rows each get an answer and a resumed run finds them)."""
    if isinstance(messages, str):
        prompt: Any = messages
    else:
        prompt = [m.model_dump(mode="json", exclude_none=True) for m in messages]
    canonical = json.dumps({"v": 1, "model": model, "prompt": prompt, **call_material},
                           sort_keys=True, ensure_ascii=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
