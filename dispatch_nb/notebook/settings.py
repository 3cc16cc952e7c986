"""The settings the notebook layer reads, as a type: the traits of ``ChatMagics``.

:class:`~dispatch_nb.notebook.state.KernelState` keeps the traits object as ``settings`` and the
modules that run cells read it through this protocol (so they need not import ``magics.py``).
It is a type for the checker: nothing imports this module at run time.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Settings"]


class Settings(Protocol):
    """The ``ChatMagics`` traits a cell reads (``docs/notebook.md``, Configuration); the cell
    code only reads them."""

    model: str
    system: str
    stream: bool
    history_length: int
    thread: str
    cache: str
    cache_file: str
    format: str
    live: str
    interpolate: bool
    max_value_chars: int
    max_rows: int
    max_tokens: int | None
    confirm_rows: int
    max_tool_rounds: int
    update_rate: float
    login_on_demand: bool
    login_min_interval: float

    # read-only members (a property accepts a narrower type): the checker reads these two
    # Float(None, allow_none=True) traits as ``int | None``
    @property
    def temperature(self) -> float | None: ...
    @property
    def timeout(self) -> float | None: ...
