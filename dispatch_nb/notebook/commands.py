"""The ``%chat`` subcommands (``docs/notebook.md``, "%chat COMMAND"): each shows one small static
output (plain text in a terminal) and never a secret.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import re
from decimal import Decimal
from typing import Any

from IPython.core.error import StdinNotImplementedError, UsageError

from ..auth.token_store import TokenStore, find_github_token
from ..cache import ResponseCache
from ..cost import PREMIUM_REQUEST_USD, PRICE_PROVIDERS, format_usd, ledger, premium_words
from ..errors import DispatchError
from ..registry import (
    base_url_rows,
    find_descriptor,
    get_descriptor,
    key_env_rows,
    list_descriptors,
    list_providers,
    parse_model_spec,
)
from ..render import dollars, plain_block, rows_markdown
from .display import ChatError, explain_error
from .live import detect_mode, ipy_display
from .login import ensure_copilot_login, run_login
from .state import KernelState

__all__ = ["run"]

#: the login flow the notebook runs itself (the device-login view of :mod:`.login`)
GITHUB_DEVICE = "github-device"


def _plain(markdown: str) -> str:
    """Short Markdown of our own as plain text: no emphasis markers, code ticks or escapes."""
    text = re.sub(r"(\*\*|__)(.+?)\1", r"\2", markdown)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\1", text)
    return text.replace("`", "").replace("\\$", "$")


def _show(markdown: str, plain: str | None = None) -> None:
    ipy_display({"text/markdown": markdown, "text/plain": plain or _plain(markdown)}, raw=True)


def _login_providers() -> list[Any]:
    """The descriptors of the providers that sign in with a login (``login_flow``)."""
    return [d for d in list_descriptors() if d.login_flow]


def login(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat login [PROVIDER] [--force]``: the provider's login (GitHub's device flow for
    Copilot; the first provider with a login by default) when not logged in already, or with
    ``--force``; how to give a key otherwise."""
    name = args.target
    descriptor = find_descriptor(name.lower()) if name else next(iter(_login_providers()), None)
    if descriptor is None and name:
        raise UsageError(f"unknown provider {name!r}; providers: {', '.join(list_providers())}")
    if descriptor is None:
        raise UsageError("no registered provider signs in with a login; use %chat key PROVIDER")
    provider = descriptor.name
    env = descriptor.key_env
    if env is not None:
        is_set = "is set" if os.environ.get(env) else "is not set"
        _show(
            f"**{provider}** uses an API key, not a login: run `%chat key {provider}` to type it "
            f"(nothing is saved in the notebook), or set `{env}` in the environment Jupyter "
            f"starts from. `{env}` {is_set}."
        )
        return
    if descriptor.login_flow != GITHUB_DEVICE:
        names = ", ".join(d.name for d in _login_providers() if d.login_flow == GITHUB_DEVICE)
        raise UsageError(f"%chat login knows {names} (GitHub device login); not {provider!r}")
    state.default_note()  # the default before the login, to say if the login changes it
    if not args.force:
        found = _github_token()
        if found is not None:
            _show(
                f"Already logged in to {descriptor.label}{_as_user(found.source)} (the token comes from "
                f"{found.source}). `%chat login --force` logs in again."
            )
            return
    run_login(state)
    note = state.default_note()
    if note:
        _show(note)


def _github_token() -> Any:
    try:
        return find_github_token()
    except Exception:
        return None


def _as_user(source: str) -> str:
    """`` as @user``: the GitHub user of the saved token, when ``source`` (where a token came
    from) is its file; else ``""``."""
    with contextlib.suppress(Exception):
        record = TokenStore().load_record()
        if record is not None and record.user and str(TokenStore().path) == source:
            return f" as @{record.user}"
    return ""


def key(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat key PROVIDER``: ask for the provider's API key (``getpass``: not echoed, not in the
    notebook) and set it in this kernel's environment."""
    descriptor = find_descriptor((args.target or "").lower())
    env = descriptor.key_env if descriptor else None
    if env is None:
        login = (f" ({descriptor.label} signs in with %chat login)"
                 if descriptor is not None and descriptor.login_flow else "")
        raise UsageError(
            "%chat key needs a provider that uses an API key: "
            + ", ".join(sorted(d.name for d in list_descriptors() if d.key_env)) + login
        )
    state.default_note()  # the default before the key, to say if the key changes it
    try:
        value = getpass.getpass(f"{env} (not shown, not saved in the notebook): ")
    except (StdinNotImplementedError, EOFError, OSError):
        raise ChatError(
            "Cannot ask for the key",
            "this front end does not let the kernel ask for input",
            f"Set {env} in the environment Jupyter starts from instead.",
        ) from None
    value = value.strip()
    if not value:
        _show(f"Nothing typed: `{env}` is unchanged ({'set' if os.environ.get(env) else 'not set'}).")
        return
    os.environ[env] = value
    state.close_adapters()  # the next cell connects with the new key
    note = state.default_note()
    _show(
        f"`{env}` is set for this kernel (until it restarts). It is not saved in the notebook or "
        "anywhere else." + (f"\n\n{note}" if note else "")
    )


def logout(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat logout``: delete the saved GitHub token; say what else could still log you in."""
    store = TokenStore()
    removed = store.delete()
    state.close_adapters()
    lines = [
        f"Removed the saved GitHub token ({store.path})." if removed else
        f"There was no saved GitHub token ({store.path})."
    ]
    found = _github_token()
    if found is not None:
        lines.append(
            f"Copilot can still sign in with the token from {found.source}; remove it there to "
            "log out completely."
        )
    _show("\n\n".join(lines))


def status(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat status``: default model and why, login, keys (set or not), cache, live view, threads."""
    settings = state.settings
    spec, reason, hint = state.default_model()
    rows = [("default model", f"`{spec}`" + (f" — {reason}" if reason else ""))]
    if hint:
        rows.append(("hint", hint))
    rows += [(descriptor.label, _login_state(descriptor)) for descriptor in _login_providers()]
    rows += [(provider, f"`{env}` {'set' if os.environ.get(env) else 'not set'}")
             for provider, env in key_env_rows()]
    rows += [(what, f"`{url}`") for what, url in base_url_rows()]
    try:
        mode = state.cache_mode()
    except UsageError as exc:  # e.g. DISPATCH_NB_CACHE=readwrite: said here, as every cell says it
        rows.append(("cache", f"⚠ {exc}"))
    else:
        cache = f"`{mode}`"
        if mode != "off":
            path = ResponseCache(settings.cache_file or None, mode).path
            cache += f" — `{path}`" + ("" if path.exists() else
                                       f" (does not exist: looked for `{path.absolute()}`)")
        if mode == "replay":  # the login and key rows above are not a to-do list then
            cache += " — plays back the recorded answers and sends nothing: no login or key is needed"
        rows.append(("cache", cache))
    rows.append(("live view", f"`{detect_mode(state.shell, settings.live)}` (asked: `{settings.live}`)"))
    threads = ", ".join(f"`{name}` ({n} turn{'' if n == 1 else 's'})"
                        for name, n in state.threads.summary().items())
    rows.append(("threads", threads or "none yet"))
    md = "| setting | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    plain = "\n".join(f"{k}: {v.replace('`', '')}" for k, v in rows)
    _show(md, plain)


def _login_state(descriptor: Any) -> str:
    """The status row of a provider with a login: logged in (as whom, from where) or not."""
    try:
        found = descriptor.login_found()
    except Exception as exc:  # a saved login that cannot be read (ValueError), a plug-in's bug
        return f"⚠ {exc}" if isinstance(exc, ValueError) else \
            f"⚠ cannot be checked ({type(exc).__name__}: {exc})"
    if found is None:
        return "not logged in — run `%chat login`"
    who = _as_user(found) if descriptor.login_flow == GITHUB_DEVICE else ""
    return f"logged in{who} (token from {found})"


def _logged_in(descriptor: Any) -> bool:
    try:
        return descriptor.login_found() is not None
    except Exception:
        return False


def models(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat models [PROVIDER]``: the models a provider offers, as a table."""
    spec = state.default_model()[0]
    provider = parse_model_spec(spec)[0]
    if args.target:
        named = args.target.split(":", 1)[0]
        if named not in list_providers():
            raise UsageError(f"unknown provider {named!r}; providers: {', '.join(list_providers())}")
        if ":" in args.target:
            spec = args.target
        elif named != provider:  # the default provider's listing uses the default model
            spec = f"{named}:{get_descriptor(named).model_for_listing}"
        provider = named
    descriptor = get_descriptor(provider)
    if descriptor.login_flow and state.cache_mode() != "replay" and not _logged_in(descriptor):
        _show(
            f"*Not logged in to {descriptor.label}*, so its models cannot be listed: run "
            f"`%chat login` first, then `%chat models {provider}`."
        )
        return
    try:
        adapter = state.adapter(spec, state.cache_mode(), login=lambda: ensure_copilot_login(state))
        found = adapter.list_models()
    except NotImplementedError:
        _show(f"*{provider} cannot list its models.*")
        return
    except DispatchError as exc:
        raise explain_error(exc, spec=spec) from None
    if not found:
        _show(f"*{provider} lists no models.*")
        return
    _show(_models_table(provider, found), "\n".join(f"{provider}:{m.id}" for m in found))


def _models_table(provider: str, found: list[Any]) -> str:
    """The models as a Markdown table with only the columns some model has data for."""
    columns: list[tuple[str, str, Any]] = [("model", "---", lambda m: f"`{provider}:{m.id}`")]
    if any(m.name and m.name != m.id for m in found):
        columns.append(("name", "---", lambda m: m.name or ""))
    if any(m.max_context_tokens for m in found):
        columns.append(
            ("context", "---:", lambda m: f"{m.max_context_tokens:,}" if m.max_context_tokens else "–")
        )
    if any(m.supports_tool_use for m in found):
        columns.append(("tools", ":---:", lambda m: "✓" if m.supports_tool_use else ""))
    if any(m.supports_vision for m in found):
        columns.append(("vision", ":---:", lambda m: "✓" if m.supports_vision else ""))
    lines = [
        "| " + " | ".join(c[0] for c in columns) + " |",
        "|" + "|".join(c[1] for c in columns) + "|",
    ]
    lines += ["| " + " | ".join(str(c[2](m)) for c in columns) + " |" for m in found]
    noun = "model" if len(found) == 1 else "models"
    return f"**{len(found)} {noun} from {provider}**\n\n" + "\n".join(lines)


def history(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat history [THREAD]``: the turns of a thread."""
    name = args.target or state.settings.thread
    if name not in state.threads:
        names = state.threads.names()
        known = f" Threads: {', '.join(names)}." if names else ""
        _show(f"*There is no thread `{name}` yet.*{known}")
        return
    thread = state.threads.get(name)
    _show(thread.to_markdown(), thread.to_plain())


def reset(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat reset [THREAD]`` (``--all`` for every thread)."""
    if args.all:
        cleared: list[Any] = state.threads.reset(None)
        _show(f"Cleared {len(cleared)} thread{'' if len(cleared) == 1 else 's'}.")
        return
    name = args.target or state.settings.thread
    cleared = state.threads.reset(name)
    _show(f"Cleared thread `{name}`." if cleared else f"*There is no thread `{name}`.*")


def cost(state: KernelState, args: argparse.Namespace) -> None:
    """``%chat cost``: this kernel's spend by model, and what replayed answers saved
    (``docs/notebook.md``)."""
    rows = ledger.rows()
    if not rows:
        _show("*No model has answered in this kernel yet.*")
        return
    table: list[dict[str, Any]] = []
    for row in rows:
        c = row.cost
        if row.calls == 0:  # every answer replayed: nothing sent, nothing spent
            usd = "—"
        elif c.unknown == row.calls:  # the answers sent had no price (replays spent nothing)
            usd = "unknown"
        else:
            usd = format_usd(c.usd) + (f" (+{c.unknown} unknown)" if c.unknown else "")
        table.append({
            "model": f"{row.provider}:{row.model}", "calls": row.calls,
            "tokens in": row.input_tokens, "out": row.output_tokens, "cached": row.cached_tokens,
            "USD": usd,
            "premium requests": "" if c.premium_requests is None else f"{c.premium_requests:g}",
            "replayed (saved)": (f"{c.replayed}" + (f" ({format_usd(c.saved_usd)})" if c.saved_usd
                                                    else "") if c.replayed else ""),
        })
    costs = [row.cost for row in rows]
    unknowns, replayed = sum(c.unknown for c in costs), sum(c.replayed for c in costs)
    premium = sum((c.premium_requests or 0 for c in costs), 0.0)
    saved_usd = sum((c.saved_usd for c in costs), Decimal(0))
    unknown = f"{unknowns:,} answer{'' if unknowns == 1 else 's'} whose price is unknown"
    if unknowns and not any(r.cost.unknown < r.calls for r in rows):  # nothing has a price
        notes = [f"Spent in this kernel: **unknown** ({unknown})."]
    else:
        notes = [f"Spent in this kernel: **{format_usd(sum((c.usd for c in costs), Decimal(0)))}**"
                 + (f" (and {unknown})" if unknowns else "") + "."]
    if premium:
        notes.append(f"GitHub Copilot: {premium_words(premium)} — "
                     f"{format_usd(PREMIUM_REQUEST_USD * Decimal(str(premium)))} at GitHub's "
                     f"published overage price of {format_usd(PREMIUM_REQUEST_USD)} per premium "
                     "request (within your plan's allowance they cost nothing extra).")
    if replayed:
        answers = f"{replayed:,} answer{'' if replayed == 1 else 's'}"
        notes.append(f"Replayed from the response cache: {answers}, which cost "
                     f"{format_usd(saved_usd)} when recorded and nothing now."
                     if saved_usd else
                     f"Replayed from the response cache: {answers}, nothing spent now.")
    if any(PRICE_PROVIDERS.get(row.provider) for row in rows):  # a figure came from it
        notes.append("Prices: genai-prices' bundled data (docs/cost.md); prices change.")
    empty = [key for key in ("cached", "premium requests", "replayed (saved)")
             if not any(r[key] for r in table)]
    body = rows_markdown([{k: v for k, v in r.items() if k not in empty} for r in table], index=False)
    text = body + "\n\n" + dollars("\n\n".join(notes))
    _show(plain_block(text), _plain(text))


def run(state: KernelState, args: argparse.Namespace) -> None:
    """Dispatch ``%chat <command>`` to the function of that name."""
    commands = {f.__name__: f for f in (login, logout, status, models, history, reset, key, cost)}
    commands[args.command](state, args)
