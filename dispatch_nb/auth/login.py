"""The GitHub device login, once (start, show the code, poll, fetch the user, save the token), for
every front end through its callbacks (docs/copilot-login.md, "One login routine")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cancel import CancelToken
from .device_flow import DeviceCode, DeviceFlow, StateCallback, fetch_github_user
from .endpoints import default_github_api_url
from .token_store import TokenStore

__all__ = ["LoginResult", "device_login"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoginResult:
    """A finished device login: the GitHub ``token`` (never in the repr), its owner's ``user``
    login, and ``path`` where it was saved — None with ``save_error`` when it could not be saved
    and the caller chose to keep it in memory (``keep_unsaved=True``)."""

    token: str = field(repr=False)
    user: str | None
    path: Path | None
    save_error: OSError | None = None


def device_login(
    flow: DeviceFlow,
    *,
    store: TokenStore | None = None,
    github_api_url: str | None = None,
    on_code: Callable[[DeviceCode], Any] | None = None,
    on_state: StateCallback | None = None,
    on_done: Callable[[LoginResult], Any] | None = None,
    on_error: Callable[[BaseException], Any] | None = None,
    cancel: CancelToken | None = None,
    keep_unsaved: bool = False,
) -> LoginResult:
    """Run GitHub's device flow to the end and save the token (docs/copilot-login.md, "One login
    routine"). ``on_error(exc)`` sees any exception, ``KeyboardInterrupt`` and an ``OSError``
    from the save included, just before it propagates."""
    store = store if store is not None else TokenStore()
    try:
        code = flow.start()
        log.debug("GitHub device login started (%s)", code.verification_uri)
        if on_code is not None:
            on_code(code)
        token = flow.poll(code, cancel=cancel, on_state=on_state)
        user = fetch_github_user(token, github_api_url or default_github_api_url(flow.github_url))
        try:
            result = LoginResult(token, user, store.save(token, user=user, github_url=flow.github_url))
        except OSError as exc:
            if not keep_unsaved:
                raise
            result = LoginResult(token, user, None, exc)
    except BaseException as exc:
        if on_error is not None:
            on_error(exc)
        raise
    if on_done is not None:
        on_done(result)
    return result
