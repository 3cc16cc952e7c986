"""Build a prompt from a ``%%chat`` cell: ``{expression}`` interpolation and bounded summaries.

The rules (``{{``/``}}`` literal braces, ``{expr}`` evaluated only when it names something, values
summarized to a bounded size) are :mod:`dispatch_nb.prompting`'s, whose docstring shows them.

``Err`` is an :class:`~dispatch_nb.notebook.state.ErrorLog` (defined in ``state.py``, part of the
kernel's state, and importable from here too): ``Err[n]`` is the exception cell ``n`` raised,
filled by a ``post_run_cell`` hook (``magics.py`` installs it). The templates themselves are core
(:mod:`dispatch_nb.prompting`, which batch rows use too); this module re-exports their names.
"""

from __future__ import annotations

from ..prompting import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_ROWS,
    Prompt,
    PromptError,
    build_prompt,
    describe_value,
)
from .state import ErrorLog

__all__ = [
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_ROWS",
    "ErrorLog",
    "Prompt",
    "PromptError",
    "build_prompt",
    "describe_value",
]


