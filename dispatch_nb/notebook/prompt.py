"""Build a prompt from a ``%%chat`` cell: ``{expression}`` interpolation and bounded summaries.

::

    Summarize {df} in one sentence.        # a DataFrame → shape + first rows as a table
    Why does this fail? {In[3]} {Err[3]}   # the source of cell 3 and the exception it raised
    Explain {len(words)} and {x:.2f}       # any expression; f-string conversions / format specs
    A literal brace: {{ and }}             # like str.format

The rules, chosen so prompts that contain JSON or code survive untouched:

* ``{{`` and ``}}`` are literal braces.
* ``{expr}`` is evaluated in the user namespace only when ``expr`` mentions a name (``{x}``,
  ``{df.head()}``, ``{Out[4]}``). Braces around constants or code that does not parse
  (``{"a": 1}``, ``{}``, ``{ foo bar }``) are left exactly as written.
* An expression naming something undefined is left as written, with a note for the user.
* An expression that raises anything else is an error: :class:`PromptError`.
* Without a format spec, values are summarized to a bounded size (``max_chars``): long text is
  cut with a note, DataFrame-like objects (duck-typed: ``shape`` + ``head``; never imports pandas)
  become their shape and first rows, exceptions become their (trimmed) traceback.

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


