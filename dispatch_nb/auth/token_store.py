"""Where the GitHub token lives (:class:`TokenStore`, one JSON file, mode 0600) and which token a
Copilot adapter uses (:func:`find_github_token`): docs/copilot-login.md, "Where the token is
stored" and "Which token is used". A secret never appears in a repr, a log record or an error.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import AuthenticationError
from .endpoints import COPILOT_CLIENT_ID, default_github_url, github_host

__all__ = [
    "GITHUB_TOKEN_ENV",
    "FoundToken",
    "StoredToken",
    "TokenStore",
    "TokenStoreError",
    "copilot_config_dir",
    "default_token_path",
    "dispatch_nb_home",
    "find_github_token",
    "mask_token",
]

log = logging.getLogger(__name__)

GITHUB_TOKEN_ENV = "DISPATCH_NB_GITHUB_TOKEN"


class TokenStoreError(AuthenticationError):
    """Our token file cannot be read or parsed; the message names the file and the fix."""

    default_code = "token_store_error"

    def __init__(self, message: str, *, path: Path, **kw: Any) -> None:
        super().__init__(message, **kw)
        #: the file at fault
        self.path = path


def dispatch_nb_home() -> Path:
    """``$DISPATCH_NB_HOME``, else the platform's user config directory for dispatch_nb."""
    home = os.environ.get("DISPATCH_NB_HOME")
    if home:
        return Path(home).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("dispatch_nb", appauthor=False))


def default_token_path() -> Path:
    """``dispatch_nb_home() / "github_token.json"``."""
    return dispatch_nb_home() / "github_token.json"


def mask_token(token: str | None) -> str:
    """A description of a token that reveals nothing usable: its kind prefix and its length.

    ``mask_token("ghu_abc…")`` → ``"ghu_… (40 characters)"``.
    """
    if not token:
        return "(none)"
    prefix = ""
    head, sep, _ = token.partition("_")
    if sep and head.isalpha() and len(head) <= 10:
        prefix = head + "_"
    return f"{prefix}… ({len(token)} characters)"


@dataclass(frozen=True)
class StoredToken:
    """The content of our token file; the repr hides the token."""

    github_token: str = field(repr=False)
    user: str | None = None
    github_url: str | None = None
    created_at: str | None = None


class FoundToken(NamedTuple):
    """A GitHub token and where it came from (``source`` is for people: "argument", a path...)."""

    token: str
    source: str

    def __repr__(self) -> str:
        return f"FoundToken(token={mask_token(self.token)!r}, source={self.source!r})"


class TokenStore:
    """Our GitHub token file: :meth:`save`, :meth:`load`, :meth:`delete`.

    A corrupt or unreadable file raises :class:`TokenStoreError` naming it; it is never silently
    overwritten or removed by :meth:`load`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_token_path()

    def __repr__(self) -> str:
        return f"TokenStore(path={str(self.path)!r})"

    def _error(self, problem: str) -> TokenStoreError:
        return TokenStoreError(
            f"The GitHub token file {self.path} {problem}. Delete it (or run "
            "`python -m dispatch_nb logout`), then log in again with "
            "`python -m dispatch_nb login` or `%chat login`.",
            path=self.path,
        )

    def exists(self) -> bool:
        return self.path.exists()

    def load_record(self) -> StoredToken | None:
        """Everything in the file, or None if there is no file."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise self._error("is a directory, not a file") from None
        except OSError as exc:
            raise self._error(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise self._error("is not valid JSON") from None
        if not isinstance(data, dict):
            raise self._error("does not hold a JSON object")
        token = data.get("github_token")
        if not isinstance(token, str) or not token.strip():
            raise self._error('has no "github_token" string')
        texts = {key: data[key] for key in ("user", "github_url", "created_at")
                 if isinstance(data.get(key), str)}
        return StoredToken(github_token=token.strip(), **texts)

    def load(self) -> str | None:
        """The stored GitHub token, or None if there is no file. Raises :class:`TokenStoreError`."""
        record = self.load_record()
        return record.github_token if record is not None else None

    def save(self, github_token: str, *, user: str | None = None, github_url: str | None = None) -> Path:
        """Write the token atomically (temp file, fsync, rename), mode 0600; returns the path."""
        if not github_token:
            raise ValueError("github_token must not be empty")
        record = {
            "github_token": github_token,
            "user": user,
            "github_url": (github_url or default_github_url()).rstrip("/"),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        data = json.dumps(record, indent=2).encode("utf-8") + b"\n"
        directory = self.path.parent
        if not directory.is_dir():
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if sys.platform != "win32":
                os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as file:
                if hasattr(os, "fchmod"):
                    os.fchmod(fd, 0o600)  # os.open's mode is filtered by the umask
                file.write(data)
                file.flush()
                os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if sys.platform != "win32":  # make the rename durable
            with contextlib.suppress(OSError):
                dir_fd = os.open(directory, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        log.debug("saved the GitHub token to %s", self.path)
        return self.path

    def delete(self) -> bool:
        """Remove our token file (only ours; editor logins are untouched). True if it existed."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.debug("deleted %s", self.path)
        return True


# -- editor logins -------------------------------------------------------------------------------
def copilot_config_dir() -> Path:
    """Where GitHub's Copilot editor plugins keep their login, as the environment says now."""
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        if local:
            return Path(local) / "github-copilot"
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path(os.path.expanduser("~")) / ".config"
    return base / "github-copilot"


def _editor_token(path: Path, host: str, client_id: str) -> str | None:
    """The ``oauth_token`` for ``host`` in an apps.json / hosts.json file.

    Keys look like ``"github.com:Iv1.b507a08c87ecfe98"`` (apps.json) or ``"github.com"``
    (hosts.json). An entry for our client id wins; otherwise the first key that starts with the
    host (the rule zed uses).
    """
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.debug("ignoring the Copilot editor file %s: %s", path, type(exc).__name__)
        return None
    first: str | None = None
    for key, entry in (data if isinstance(data, dict) else {}).items():
        if not isinstance(key, str) or not isinstance(entry, dict):
            continue
        token = entry.get("oauth_token")
        lowered = key.lower()
        if not isinstance(token, str) or not token or not lowered.startswith(host):
            continue
        if lowered == f"{host}:{client_id.lower()}" or entry.get("githubAppId") == client_id:
            return token
        first = first or token
    return first


def find_github_token(
    explicit: str | None = None,
    *,
    token_path: str | os.PathLike[str] | None = None,
    github_url: str | None = None,
    client_id: str = COPILOT_CLIENT_ID,
) -> FoundToken | None:
    """The GitHub token to use and its source ("argument", the variable's name, a path), or None
    (docs/copilot-login.md, "Which token is used"); the environment is read at call time. A
    corrupt token file of ours raises :class:`TokenStoreError` rather than being skipped."""
    if explicit:
        return FoundToken(explicit.strip(), "argument")
    if env := os.environ.get(GITHUB_TOKEN_ENV, "").strip():
        return FoundToken(env, GITHUB_TOKEN_ENV)
    host = github_host((github_url or default_github_url()).rstrip("/"))
    store = TokenStore(token_path)
    record = store.load_record()
    if record is not None:
        if record.github_url is None or github_host(record.github_url) == host:
            return FoundToken(record.github_token, str(store.path))
        log.debug("skipping %s: it holds a token for %s, not %s", store.path,
                  github_host(record.github_url), host)
    for name in ("apps.json", "hosts.json"):
        path = copilot_config_dir() / name
        if token := _editor_token(path, host, client_id):
            return FoundToken(token, f"Copilot editor login ({path})")
    return None
