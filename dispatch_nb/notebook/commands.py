"""The ``%chat`` subcommands: ``login``, ``logout``, ``status``, ``models``, ``history``, ``reset``.

Each shows one small static output (Markdown where a kernel renders it, text in a terminal) and
never prints a secret: tokens and keys appear only as "set" / "not set" and where they come from.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from .magics import ChatMagics

__all__ = ["run"]

#: a model to name when only listing a provider's models (the listing does not depend on it)
_LISTING_MODEL = {
    "copilot": "gpt-4.1",
    "openai": "gpt-4.1",
    "anthropic": "claude-sonnet-4-5",
    "local": "smollm2",
    "fake": "echo",
}

_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "compatible": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}


def _show(markdown: str, plain: str | None = None) -> None:
    from .live import ipy_display

    ipy_display({"text/markdown": markdown, "text/plain": plain or markdown}, raw=True)


def run(magics: ChatMagics, args: argparse.Namespace) -> None:
    """Dispatch ``%chat <command>``."""
    handler = {
        "login": login,
        "logout": logout,
        "status": status,
        "models": models,
        "history": history,
        "reset": reset,
    }[args.command]
    handler(magics, args)


def login(magics: ChatMagics, args: argparse.Namespace) -> None:
    """``%chat login [PROVIDER]``: the GitHub device login for Copilot; key advice otherwise."""
    provider = (args.target or "copilot").lower()
    if provider in _KEY_ENV:
        env = _KEY_ENV[provider]
        state = "is set" if os.environ.get(env) else "is not set"
        _show(
            f"**{provider}** uses an API key, not a login: set `{env}` "
            f"(e.g. `%env {env}=...`). `{env}` {state}."
        )
        return
    if provider != "copilot":
        raise UsageError(f"%chat login knows copilot (GitHub device login); not {provider!r}")
    from .login import run_login

    run_login(magics, force=True)


def logout(magics: ChatMagics, args: argparse.Namespace) -> None:
    """``%chat logout``: delete the saved GitHub token; say what else could still log you in."""
    from ..auth.token_store import TokenStore, find_github_token

    store = TokenStore()
    removed = store.delete()
    magics.close_adapters()
    lines = [
        f"Removed the saved GitHub token ({store.path})." if removed else
        f"There was no saved GitHub token ({store.path})."
    ]
    try:
        found = find_github_token()
    except Exception:
        found = None
    if found is not None:
        lines.append(
            f"Copilot can still sign in with the token from {found.source}; remove it there to "
            "log out completely."
        )
    _show("\n\n".join(lines))


def status(magics: ChatMagics, args: argparse.Namespace) -> None:
    """``%chat status``: default model and why, login, keys (set or not), cache, live view, threads."""
    from .cell import cache_mode, resolve_default
    from .live import detect_mode

    spec, reason, hint = resolve_default(magics)
    rows = [("default model", f"`{spec}`" + (f" — {reason}" if reason else ""))]
    if hint:
        rows.append(("hint", hint))
    rows.append(("GitHub Copilot", _copilot_state()))
    for provider, env in (("OpenAI", "OPENAI_API_KEY"), ("Anthropic", "ANTHROPIC_API_KEY")):
        rows.append((provider, f"`{env}` {'set' if os.environ.get(env) else 'not set'}"))
    if os.environ.get("OPENAI_BASE_URL"):
        rows.append(("OpenAI base URL", f"`{os.environ['OPENAI_BASE_URL']}`"))
    mode = cache_mode(magics, None)
    cache = f"`{mode}`"
    if mode != "off":
        from ..cache import ResponseCache

        cache += f" — `{ResponseCache(magics.cache_file or None, mode).path}`"
    rows.append(("cache", cache))
    rows.append(("live view", f"`{detect_mode(magics.shell, magics.live)}` (asked: `{magics.live}`)"))
    threads = magics.threads.summary()
    rows.append(
        (
            "threads",
            ", ".join(f"`{name}` ({n} turns)" for name, n in threads.items()) or "none yet",
        )
    )
    md = "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    plain = "\n".join(f"{k}: {v.replace('`', '')}" for k, v in rows)
    _show(md, plain)


def _copilot_state() -> str:
    try:
        from ..auth.token_store import TokenStore, find_github_token

        found = find_github_token()
    except Exception as exc:
        return f"⚠ {exc}"
    if found is None:
        return "not logged in — run `%chat login`"
    user = None
    try:
        record = TokenStore().load_record()
        if record is not None and str(TokenStore().path) == found.source:
            user = record.user
    except Exception:
        pass
    who = f" as @{user}" if user else ""
    return f"logged in{who} (token from {found.source})"


def models(magics: ChatMagics, args: argparse.Namespace) -> None:
    """``%chat models [PROVIDER]``: the models a provider offers, as a table."""
    from ..errors import DispatchError
    from ..registry import list_providers, parse_model_spec
    from .cell import cache_mode, default_spec, get_adapter
    from .display import explain_error

    if args.target:
        provider = args.target.split(":", 1)[0]
        if provider not in list_providers():
            raise UsageError(
                f"unknown provider {provider!r}; providers: {', '.join(list_providers())}"
            )
        default_provider, default_model = parse_model_spec(default_spec(magics)[0])
        if ":" in args.target:
            spec = args.target
        elif provider == default_provider:
            spec = f"{provider}:{default_model}"
        else:
            spec = f"{provider}:{_LISTING_MODEL.get(provider, 'default')}"
    else:
        spec = default_spec(magics)[0]
        provider = parse_model_spec(spec)[0]
    try:
        adapter = get_adapter(magics, spec, cache_mode(magics, None))
        found = adapter.list_models()
    except NotImplementedError:
        _show(f"*{provider} cannot list its models.*")
        return
    except DispatchError as exc:
        raise explain_error(exc, spec=spec) from None
    if not found:
        _show(f"*{provider} lists no models.*")
        return
    lines = ["| model | name | context | tools | vision |", "|---|---|---:|:---:|:---:|"]
    for m in found:
        context = f"{m.max_context_tokens:,}" if m.max_context_tokens else "–"
        lines.append(
            f"| `{provider}:{m.id}` | {m.name or ''} | {context} | "
            f"{'✓' if m.supports_tool_use else ''} | {'✓' if m.supports_vision else ''} |"
        )
    plain = "\n".join(f"{provider}:{m.id}" for m in found)
    _show(f"**{len(found)} models from {provider}**\n\n" + "\n".join(lines), plain)


def history(magics: ChatMagics, args: argparse.Namespace) -> None:
    """``%chat history [THREAD]``: the turns of a thread."""
    name = args.target or magics.thread
    if name not in magics.threads:
        names = magics.threads.names()
        known = f" Threads: {', '.join(names)}." if names else ""
        _show(f"*There is no thread `{name}` yet.*{known}")
        return
    thread = magics.threads.get(name)
    plain = "\n\n".join(f"You: {t.prompt}\nAssistant: {t.answer}" for t in thread) or "(empty)"
    _show(thread.to_markdown(), plain)


def reset(magics: ChatMagics, args: argparse.Namespace) -> None:
    """``%chat reset [THREAD]`` (``--all`` for every thread)."""
    if args.all:
        cleared: list[Any] = magics.threads.reset(None)
        _show(f"Cleared {len(cleared)} thread(s).")
        return
    name = args.target or magics.thread
    cleared = magics.threads.reset(name)
    _show(f"Cleared thread `{name}`." if cleared else f"*There is no thread `{name}`.*")
