"""Moved to :mod:`dispatch_nb.wire.responses` (the OpenAI Responses wire format); this module
re-exports its names so existing imports keep working."""

from __future__ import annotations

from ..wire.responses import *  # noqa: F403
from ..wire.responses import __all__ as __all__
