"""Sessions: one conversation with a model, running Python tools, that never hangs or loses what
arrived (the tool loop, failures, streams and turn control: docs/sessions.md).

:mod:`~dispatch_nb.session.core` is the :class:`Session` object and its turn loop,
:mod:`~dispatch_nb.session.stream` the stream objects, :mod:`~dispatch_nb.session.serialization`
the saved format and :mod:`~dispatch_nb.session.inputs` tools and content, normalized.
"""

from __future__ import annotations

from ..cancel import CancelToken
from ..tools import Tool, tool
from .core import Session
from .stream import AsyncSessionStream, SessionStream

__all__ = [
    "AsyncSessionStream",
    "CancelToken",
    "Session",
    "SessionStream",
    "Tool",
    "tool",
]
