"""Which model to use when nobody said: :func:`resolve_default_model` (the order:
docs/providers.md, "who reads the descriptor"). The resolution lives in the registry, which reads
it for bare model names (this module would otherwise import it in a cycle); this is its
documented home.
"""

from __future__ import annotations

from .registry import EMBEDDED_MODEL_NOTE as LOCAL_HINT
from .registry import LOGIN_HINT, Resolution, resolve_default_model

__all__ = ["LOCAL_HINT", "LOGIN_HINT", "Resolution", "resolve_default_model"]
