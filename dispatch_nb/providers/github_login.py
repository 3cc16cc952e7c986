"""Where a saved GitHub login for Copilot is, without touching the network: the ``find_login``
of the ``copilot`` provider's descriptor (:class:`~dispatch_nb.registry.ProviderDescriptor`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["find_login"]


def find_login(env: Mapping[str, str]) -> str | None:
    """Where a GitHub token for Copilot is (``DISPATCH_NB_GITHUB_TOKEN``, our token file, or a
    Copilot editor login: a description, never the token), or None. ``DISPATCH_NB_HOME``,
    ``DISPATCH_NB_GITHUB_TOKEN`` and ``DISPATCH_NB_GITHUB_URL`` are read from ``env``; the editor
    login where the process's ``HOME`` / ``XDG_CONFIG_HOME`` point. A saved login that cannot be
    read raises ``ValueError``."""
    from ..auth.token_store import find_github_token

    explicit = env.get("DISPATCH_NB_GITHUB_TOKEN", "").strip() or None
    home = env.get("DISPATCH_NB_HOME", "").strip()
    token_path = Path(home).expanduser() / "github_token.json" if home else None
    github_url = env.get("DISPATCH_NB_GITHUB_URL", "").strip() or None
    try:
        found = find_github_token(explicit, token_path=token_path, github_url=github_url)
    except Exception as exc:  # a corrupt token file must not break the choice of a model
        raise ValueError(f"the saved GitHub login cannot be read ({exc})") from exc
    if found is None:
        return None
    return "DISPATCH_NB_GITHUB_TOKEN" if found.source == "argument" else found.source
