"""The settings the notebook layer reads, as a type: the traits of ``ChatMagics``.

:class:`~dispatch_nb.notebook.state.KernelState` keeps the traits object as ``settings`` and the
modules that run cells read it through this protocol (so they need not import ``magics.py``).
It is a type for the checker: nothing imports this module at run time.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Settings"]


class Settings(Protocol):
    """The ``ChatMagics`` traits a cell reads (``docs/notebook.md``, Configuration); read-only."""

    @property
    def model(self) -> str: ...

    @property
    def system(self) -> str: ...

    @property
    def stream(self) -> bool: ...

    @property
    def history_length(self) -> int: ...

    @property
    def thread(self) -> str: ...

    @property
    def cache(self) -> str: ...

    @property
    def cache_file(self) -> str: ...

    @property
    def format(self) -> str: ...

    @property
    def live(self) -> str: ...

    @property
    def interpolate(self) -> bool: ...

    @property
    def max_value_chars(self) -> int: ...

    @property
    def max_rows(self) -> int: ...

    @property
    def max_tokens(self) -> int | None: ...

    @property
    def confirm_rows(self) -> int: ...

    @property
    def temperature(self) -> float | None: ...

    @property
    def timeout(self) -> float | None: ...

    @property
    def max_tool_rounds(self) -> int: ...

    @property
    def update_rate(self) -> float: ...

    @property
    def login_on_demand(self) -> bool: ...

    @property
    def login_min_interval(self) -> float: ...
