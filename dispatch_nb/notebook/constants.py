"""The notebook's light constants: the choices of the magics' options and traits.

Standard library only, with no import at all: ``magics.py`` (loaded by ``%load_ext``) and the
heavier modules that run a cell read the same tuples from here.
"""

from __future__ import annotations

__all__ = ["CACHE_MODES", "FORMATS", "LIVE_MODES", "SUBCOMMANDS"]

#: ``-f`` / ``ChatMagics.format``
FORMATS = ("markdown", "text", "code", "json")
#: ``--cache`` / ``ChatMagics.cache`` (the same modes as :data:`dispatch_nb.cache.CACHE_MODES`)
CACHE_MODES = ("off", "read-write", "replay", "record")
#: ``ChatMagics.live`` / ``$DISPATCH_NB_LIVE``
LIVE_MODES = ("auto", "widget", "display", "text")
#: ``%chat COMMAND``
SUBCOMMANDS = ("login", "logout", "status", "models", "history", "reset", "key", "cost", "mcp")
