"""``{expression}`` interpolation for ``%%chat`` prompts: the templates are core
(:mod:`dispatch_nb.prompting`, whose docstring shows the rules; batch rows fill them too) and are
re-exported here with ``Err``'s :class:`~dispatch_nb.notebook.state.ErrorLog`.
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


