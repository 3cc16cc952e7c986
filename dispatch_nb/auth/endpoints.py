"""Where GitHub lives: the web URL (device flow) and the REST API URL (user, Copilot token), from
the environment when a function is called (docs/copilot-login.md, "GitHub Enterprise")."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

__all__ = ["COPILOT_CLIENT_ID", "default_github_api_url", "default_github_url", "github_host"]

#: The OAuth client id of GitHub's own Copilot editor app (the one VS Code, JetBrains, Neovim and
#: Zed use). Its tokens are accepted by the Copilot token exchange.
COPILOT_CLIENT_ID = "Iv1.b507a08c87ecfe98"


def default_github_url() -> str:
    """``$DISPATCH_NB_GITHUB_URL``, else ``https://github.com`` (no trailing slash)."""
    return (os.environ.get("DISPATCH_NB_GITHUB_URL") or "https://github.com").rstrip("/")


def default_github_api_url(github_url: str | None = None) -> str:
    """``$DISPATCH_NB_GITHUB_API_URL``, else the REST API URL of ``github_url`` (or of the default).

    ``https://github.com`` → ``https://api.github.com``; GitHub Enterprise Cloud with data
    residency (``https://<name>.ghe.com``) → ``https://api.<name>.ghe.com``; GitHub Enterprise
    Server (``https://ghe.example.com``) → ``https://ghe.example.com/api/v3``.
    """
    explicit = os.environ.get("DISPATCH_NB_GITHUB_API_URL")
    if explicit:
        return explicit.rstrip("/")
    github_url = (github_url or default_github_url()).rstrip("/")
    parts = urlsplit(github_url)
    host = (parts.hostname or "").lower()
    if host in ("github.com", "www.github.com"):
        return "https://api.github.com"
    if host.endswith(".ghe.com"):
        return f"{parts.scheme}://api.{parts.netloc}"
    return f"{github_url}/api/v3"


def github_host(github_url: str) -> str:
    """The host name of a GitHub URL, lower-cased, without port (``github.com``)."""
    return (urlsplit(github_url).hostname or github_url).lower()
