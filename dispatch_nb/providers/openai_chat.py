"""Moved to :mod:`dispatch_nb.wire.chat_completions` (the chat.completions wire format); this
module re-exports its names so existing imports keep working."""

from __future__ import annotations

from ..wire.chat_completions import *  # noqa: F403
from ..wire.chat_completions import __all__ as __all__
