"""The kernel's notebook state: one :class:`KernelState` per shell, held by ``ChatMagics``; the
modules that run cells and commands receive it and change it only through its methods. Imported
by ``%load_ext``: standard library and IPython only at run time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from ..adapter import Adapter
    from ..cache import ResponseCache
    from .magics import ChatMagics
    from .threads import ThreadStore

__all__ = ["ErrorLog", "KernelState"]


class ErrorLog(dict):  # type: ignore[type-arg]
    """``Err[n]``: the exception cell ``n`` raised (only cells that failed have an entry)."""

    def __missing__(self, key: Any) -> Any:
        raise KeyError(
            f"cell {key!r} raised no error this session (cells with errors: "
            f"{', '.join(map(str, sorted(self))) or 'none'})"
        )


class KernelState:
    """Everything the notebook layer keeps between cells of one kernel; ``shell`` (``None`` outside
    one, e.g. in a unit test) and ``settings`` (the ``ChatMagics`` traits) are only read."""

    def __init__(self, shell: Any, settings: ChatMagics) -> None:
        self.shell = shell
        self.settings = settings
        #: exceptions of earlier cells by execution count (``Err`` in the user namespace)
        self.errors = ErrorLog()
        #: the adapters the cells opened, by ``(spec, cache mode)``
        self.adapters: dict[tuple[str, str, str], Adapter] = {}
        #: the response caches, by mode
        self.caches: dict[str, ResponseCache] = {}
        #: the running or last device-login view (None before any)
        self.login_view: Any = None
        #: the front end's id of the cell running now (None when it sent none)
        self.cell_id: str | None = None
        #: the number (``In[n]``) of the cell running now, when IPython counts it
        self.execution_count: int | None = None
        self._threads: ThreadStore | None = None
        self._occurrences: dict[str, int] = {}
        self._occurrence_count: int | None = None
        #: the default model's provider when this kernel last looked (see :meth:`default_note`)
        self._default_provider: str | None = None
        #: the default model's hint a cell last showed (a cell shows it once, not every time)
        self.hint_shown = ""

    # -- conversations ---------------------------------------------------------------------------
    @property
    def threads(self) -> ThreadStore:
        """The conversation threads of this kernel (keeping ``settings.history_length`` turns)."""
        if self._threads is None:
            from .threads import ThreadStore  # not at %load_ext: it imports the core types

            self._threads = ThreadStore()
        self._threads.max_turns = self.settings.history_length
        return self._threads

    # -- the running cell ------------------------------------------------------------------------
    def begin_cell(self, info: Any) -> None:
        """``pre_run_cell``: remember the running cell's id and number; a new execution restarts
        the occurrence count."""
        self.cell_id = getattr(info, "cell_id", None) or None
        self._occurrences = {}
        self._occurrence_count = getattr(self.shell, "execution_count", None)
        # IPython has already counted this cell: its number is one less (when it is counted).
        counted = getattr(info, "store_history", False) and not getattr(info, "silent", False)
        count = self._occurrence_count
        self.execution_count = count - 1 if counted and isinstance(count, int) else None

    def end_cell(self, result: Any) -> None:
        """``post_run_cell``: store the cell's exception as ``Err[n]``; forget the finished cell's
        identity (a ``run_cell_magic`` call outside any cell must not take the last cell's turn)."""
        self.cell_id = None
        self.execution_count = None
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        count = getattr(result, "execution_count", None)
        if error is not None and count is not None and not getattr(result.info, "silent", False):
            self.errors[count] = error

    def next_occurrence(self, base: str) -> int:
        """How many chat calls with identity ``base`` this execution already made."""
        count = getattr(self.shell, "execution_count", None)
        if count != self._occurrence_count:
            self._occurrences = {}
            self._occurrence_count = count
        n = self._occurrences.get(base, 0)
        self._occurrences[base] = n + 1
        return n

    @property
    def label(self) -> str:
        """How the response cache names the running cell: ``In[n]``, else ``%%chat``."""
        return f"In[{self.execution_count}]" if self.execution_count is not None else "%%chat"

    # -- models ----------------------------------------------------------------------------------
    def default_model(self) -> tuple[str, str, str]:
        """The default model spec, why it was chosen, and a hint for the user (or ``""``)."""
        if model := self.settings.model.strip():
            return model, "%config ChatMagics.model", ""
        from ..defaults import resolve_default_model

        resolved = resolve_default_model()
        return resolved.spec, resolved.reason, resolved.login_hint

    def default_note(self) -> str:
        """One line saying the default provider changed since this kernel last looked (e.g.
        after ``%chat key openai`` or ``%chat login``), or ``""``; the first look says nothing."""
        from ..registry import find_descriptor, parse_model_spec

        spec, reason, _hint = self.default_model()
        try:
            provider = parse_model_spec(spec, spec)[0] if spec else ""
        except Exception:
            return ""
        previous, self._default_provider = self._default_provider, provider
        if previous is None or previous == provider:
            return ""
        descriptor = find_descriptor(provider)
        label = descriptor.label if descriptor else provider
        return (f"The default model is now {spec} ({reason}): -m with a bare model name now "
                f"means {label}.")

    def model_specs(self, value: str | None, mode: str | None = None) -> list[str]:
        """``-m a,b,c`` → ``["p:a", "p:b", "p:c"]`` (a bare model name gets the default
        provider, the one ``%chat status`` shows, or its vendor's: ``parse_model_spec``);
        nothing → the default model. In ``mode`` ``replay`` a bare name is the provider's that
        recorded it (``ResponseCache.qualify``), and needs no credentials (nothing is sent)."""
        from ..errors import AuthenticationError, RequestError
        from ..registry import qualify_model_spec

        if not value or not value.strip():
            specs = [self.default_model()[0]]
        else:
            specs = [s.strip() for s in value.split(",") if s.strip()]
            if not specs:
                raise UsageError("-m needs a model spec, e.g. -m openai:gpt-4.1")
        qualified = []
        default = self.settings.model.strip() or None  # None: the registry's default model
        for spec in specs:
            try:
                qualified.append(self.response_cache(mode).qualify(spec, default)
                                 if mode == "replay" else qualify_model_spec(spec, default))
            except (RequestError, AuthenticationError) as exc:
                from .display import explain_error

                raise explain_error(exc, spec=spec) from None
        if len(set(qualified)) != len(qualified):
            raise UsageError(f"-m lists a model twice: {value}")
        return qualified

    def cache_mode(self, requested: str | None = None) -> str:
        """The cache mode in force: ``--cache``, else ``ChatMagics.cache``, else
        ``$DISPATCH_NB_CACHE``, else ``off`` (a wrong ``$DISPATCH_NB_CACHE``: a ``UsageError``)."""
        from ..cache import resolve_cache_mode

        try:
            return resolve_cache_mode(requested or self.settings.cache or None)
        except ValueError as exc:  # one line, not a traceback through the library
            raise UsageError(str(exc)) from None

    def response_cache(self, mode: str) -> ResponseCache:
        """The response cache of ``mode`` (one per mode, opened on first use)."""
        cache = self.caches.get(mode)
        if cache is None:
            from ..cache import ResponseCache

            cache = self.caches[mode] = ResponseCache(self.settings.cache_file or None, mode)
        return cache

    def needs_login(self, provider: str, mode: str) -> bool:
        """True when a call to ``provider`` (one with a ``login_flow``: GitHub Copilot) should
        first make sure of its login: with ``login_on_demand``, unless replaying (nothing sent)."""
        from ..registry import find_descriptor

        descriptor = find_descriptor(provider)
        return (descriptor is not None and descriptor.login_flow is not None
                and self.settings.login_on_demand and mode != "replay")

    def adapter(
        self, spec: str, mode: str = "off", *, login: Callable[[], object] | None = None
    ) -> Adapter:
        """The adapter for ``spec`` (kept for the next cells), behind the response cache unless
        ``mode`` is ``off``. Before a new adapter that :meth:`needs_login` is made, ``login`` is
        called (the notebook's device-login view). An adapter is kept per server too: after
        ``%env OPENAI_BASE_URL=...`` (the provider's ``base_url_env``) the next cell connects to
        the server it names, not to the one the kept adapter was made for."""
        key = (spec, mode, _server_named(spec))
        cached = self.adapters.get(key)
        if cached is not None:
            return cached
        from ..registry import parse_model_spec
        from ..replay_only import connect_for_cache

        provider, model = parse_model_spec(spec, self.settings.model.strip() or None)
        if login is not None and self.needs_login(provider, mode):
            login()
        adapter = connect_for_cache(f"{provider}:{model}", mode)  # replay needs no model either
        if mode != "off":
            from ..cache import CachedAdapter

            adapter = CachedAdapter(adapter, self.response_cache(mode))
        self.adapters[key] = adapter
        return adapter

    def close_adapters(self) -> None:
        """Close every kept adapter and forget the caches (both are reopened on demand)."""
        adapters, self.adapters = self.adapters, {}
        self.caches = {}
        for adapter in adapters.values():
            with contextlib.suppress(Exception):
                adapter.close()


def _server_named(spec: str) -> str:
    """The server the environment names for ``spec``'s provider (its ``base_url_env``), or
    ``""`` (none is set, or the provider has no such variable)."""
    from ..registry import find_descriptor

    descriptor = find_descriptor(spec.partition(":")[0])
    variable = descriptor.base_url_env if descriptor is not None else None
    return os.environ.get(variable, "").strip() if variable else ""
