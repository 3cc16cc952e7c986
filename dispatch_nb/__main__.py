"""``python -m dispatch_nb COMMAND`` (also installed as ``dispatch-nb``): ``login``, ``logout``,
``status`` and ``demo``. A command is a handler and an ``arguments(parser)`` function that adds its
options, listed in :data:`COMMANDS` (``--help`` prints them).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .auth import (
    CopilotTokenManager,
    DeviceCode,
    DeviceFlow,
    DeviceFlowState,
    TokenStore,
    TokenStoreError,
    copilot_config_dir,
    default_github_api_url,
    default_github_url,
    fetch_github_user,
    find_github_token,
    mask_token,
)
from .auth.login import LoginResult, device_login
from .auth.token_store import GITHUB_TOKEN_ENV
from .errors import DispatchError

__all__ = ["COMMANDS", "build_parser", "main"]

#: runs a command; returns the exit status
Handler = Callable[[argparse.Namespace], int]
#: adds a command's options to its parser
Arguments = Callable[[argparse.ArgumentParser], Any]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered command."""
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="dispatch_nb: large language models from Jupyter. Log in to GitHub Copilot "
        "and check the setup from a terminal.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages (never secrets)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, run, arguments) in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text)
        arguments(sub)
        sub.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command line; returns the exit status (130 after Ctrl-C)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Handler | None = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    try:
        status = run(args)
        sys.stdout.flush()  # here, where a reader that has gone (`| head`) is caught below
        return status
    except KeyboardInterrupt:
        print("\nInterrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `status | head`: the reader has gone, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK


def _prog() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not argv0 or argv0 in ("__main__.py", "-c", "-m"):
        return "python -m dispatch_nb"
    return argv0


# -- shared options --------------------------------------------------------------------------------
def _github_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--github-url",
        metavar="URL",
        help="GitHub's web URL (default: $DISPATCH_NB_GITHUB_URL, else https://github.com)",
    )
    parser.add_argument(
        "--github-api-url",
        metavar="URL",
        help="GitHub's API URL (default: $DISPATCH_NB_GITHUB_API_URL, else derived from the GitHub URL)",
    )
    _token_path_argument(parser)


def _token_path_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-path",
        metavar="PATH",
        help="the token file (default: $DISPATCH_NB_HOME/github_token.json)",
    )


def _urls(args: argparse.Namespace) -> tuple[str, str]:
    github_url = (args.github_url or default_github_url()).rstrip("/")
    api_url = (args.github_api_url or default_github_api_url(github_url)).rstrip("/")
    return github_url, api_url


def _fail(message: str) -> int:
    # a terminal shows no Markdown: hints name commands without backticks
    print(f"error: {message.replace('`', '')}", file=sys.stderr)
    return EXIT_FAILED


# -- login -----------------------------------------------------------------------------------------
def _login_arguments(parser: argparse.ArgumentParser) -> None:
    _github_arguments(parser)
    parser.add_argument(
        "--force", action="store_true", help="log in even if a GitHub token is already available"
    )


def _show_code(code: DeviceCode) -> None:
    minutes = max(1, round(code.expires_in / 60))
    print("To log in to GitHub Copilot, open this page in a browser:")
    print(f"    {code.verification_uri}")
    print(f"and enter the code:  {code.user_code}")
    print(f"(the code is valid for {minutes} minutes)")
    print("Waiting for approval... (Ctrl-C to cancel)", flush=True)


def _show_state(state: DeviceFlowState, info: Any) -> None:
    if state is DeviceFlowState.SLOW_DOWN:
        print(f"GitHub asked us to check less often (every {info['interval']:g} s).", flush=True)


def _login(args: argparse.Namespace) -> int:
    github_url, api_url = _urls(args)
    store = TokenStore(args.token_path)
    if not args.force:
        try:
            found = find_github_token(token_path=store.path, github_url=github_url)
        except TokenStoreError as exc:
            return _fail(f"{exc.message}\nOr run login --force to replace it.")
        if found is not None:
            print(f"Already logged in: the GitHub token comes from {found.source}.")
            print("Run python -m dispatch_nb login --force to log in again.")
            return EXIT_OK
    saved: list[LoginResult] = []  # a Ctrl-C after the token file was written is no cancel
    try:
        result = device_login(DeviceFlow(github_url=github_url), store=store, github_api_url=api_url,
                              on_code=_show_code, on_state=_show_state, on_done=saved.append)
    except KeyboardInterrupt:
        if saved:
            raise
        print("\nLogin cancelled; nothing was stored.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except DispatchError as exc:
        return _fail(f"login failed: {exc.message}")
    except OSError as exc:
        return _fail(f"could not save the token to {store.path}: {exc.strerror or exc}")
    print(f"Logged in as {result.user}." if result.user else "Logged in.")
    print(f"The GitHub token is saved in {result.path} (readable only by you).")
    if os.environ.get(GITHUB_TOKEN_ENV):
        print(f"Note: {GITHUB_TOKEN_ENV} is set, and it takes precedence over the saved token.")
    return EXIT_OK


# -- logout ----------------------------------------------------------------------------------------
def _logout_arguments(parser: argparse.ArgumentParser) -> None:
    _token_path_argument(parser)
    parser.add_argument("--github-url", metavar="URL", help=argparse.SUPPRESS)


def _logout(args: argparse.Namespace) -> int:
    store = TokenStore(args.token_path)
    try:
        removed = store.delete()
    except OSError as exc:
        return _fail(f"could not remove {store.path}: {exc.strerror or exc}")
    if removed:
        print(f"Removed the GitHub token saved in {store.path}.")
    else:
        print(f"No GitHub token is saved in {store.path}; nothing to remove.")
    print(f"Copilot editor logins ({copilot_config_dir()}) are not touched.")
    try:
        remaining = find_github_token(token_path=store.path, github_url=args.github_url)
    except TokenStoreError:
        remaining = None
    if remaining is not None:
        print(f"dispatch_nb will still use the GitHub token from {remaining.source}.")
    return EXIT_OK


# -- status ----------------------------------------------------------------------------------------
def _status_arguments(parser: argparse.ArgumentParser) -> None:
    _github_arguments(parser)
    parser.add_argument(
        "--models",
        action="store_true",
        help="also list the chat models Copilot offers this account (GET /models)",
    )


def _print_models(args: argparse.Namespace, github_url: str, api_url: str) -> int:
    from .providers.copilot import CopilotAdapter

    adapter = CopilotAdapter(github_url=github_url, github_api_url=api_url, token_path=args.token_path)
    try:
        models = adapter.list_models()
    except DispatchError as exc:
        print(f"Models:         could not list them. {exc.message}")
        return EXIT_FAILED
    finally:
        adapter.close()
    print(f"Models:         {len(models)} (premium requests per call; context window in tokens)")
    width = max((len(m.id) for m in models), default=0)
    for m in models:
        multiplier = "?" if m.premium_multiplier is None else f"{m.premium_multiplier:g}x"
        context = f"{m.max_context_tokens:,}" if m.max_context_tokens else "?"
        vendor = f" ({m.vendor})" if m.vendor else ""
        print(f"    {m.id:<{width}}  {multiplier:>5}  {context:>9}  {m.name}{vendor}")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from .defaults import resolve_default_model
    from .registry import BUILTIN_PROVIDERS, base_url_rows, key_env_rows, list_descriptors, parse_model_spec

    github_url, api_url = _urls(args)
    copilot = _copilot_status(args, github_url, api_url)
    working = [copilot] if copilot else []
    for name, env in key_env_rows():
        is_set = bool(os.environ.get(env, "").strip())
        if is_set:
            working.append(name)
        print(f"{name + ':':<15} {env} is {'set' if is_set else 'not set'}")
    for name, value in base_url_rows():
        print(f"{name + ':':<15} {value}")
    for descriptor in list_descriptors():
        if descriptor.available is None:
            continue
        label = f"{descriptor.label}:"
        try:
            available = descriptor.is_available()
        except Exception as exc:  # a plug-in's check that fails
            print(f"{label:<15} ⚠ cannot be checked ({type(exc).__name__}: {exc})")
            continue
        if available:
            working.append(descriptor.label)
            print(f"{label:<15} available ({descriptor.name}:{descriptor.example_model}, offline)")
        else:  # a plug-in's extra is not ours to name
            print(f"{label:<15} " + ("not installed (pip install 'dispatch-nb[local]')" if
                                     descriptor.name in BUILTIN_PROVIDERS else "not available here"))
    resolved = resolve_default_model()
    print(f"{'Default model:':<16}{resolved.spec} ({resolved.reason})")
    try:
        parse_model_spec(resolved.spec)
    except DispatchError as exc:  # DISPATCH_NB_MODEL=opneai:gpt-4.1: said now, not at first use
        mine = " (one your own code registers is not known here)" \
            if exc.code == "unknown_provider" else ""
        print(f"{'':<16}⚠ {exc.message}{mine}")
    if copilot and args.models and _print_models(args, github_url, api_url) != EXIT_OK:
        return EXIT_FAILED
    if not working:
        print("Nothing would work yet: log in with python -m dispatch_nb login, set an API key, "
              "or install the embedded model.")
        return EXIT_FAILED
    return EXIT_OK


def _copilot_status(args: argparse.Namespace, github_url: str, api_url: str) -> str:
    """Print the GitHub / Copilot lines; ``"GitHub Copilot"`` when it works, else ``""`` (a
    broken token file too: said, and the rest of the report follows)."""
    print(f"GitHub:         {github_url} (API {api_url})")
    try:
        found = find_github_token(token_path=args.token_path, github_url=github_url)
    except TokenStoreError as exc:
        print(f"GitHub token:   ⚠ {exc.message}")
        print("Copilot:        not available until the token file is fixed or replaced")
        return ""
    if found is None:
        print("GitHub token:   none. Log in with python -m dispatch_nb login.")
        print("Copilot:        not logged in")
        return ""
    print(f"GitHub token:   {mask_token(found.token)}, from {found.source}")
    user = fetch_github_user(found.token, api_url)
    print(f"GitHub user:    {user or 'unknown (GET /user failed)'}")
    manager = CopilotTokenManager(found.token, github_api_url=api_url)
    try:
        copilot = manager.get()
    except DispatchError as exc:
        print(f"Copilot:        not available. {exc.message}")
        return ""
    expiry = _dt.datetime.fromtimestamp(copilot.expires_at).astimezone()
    minutes = max(0, round(copilot.expires_in() / 60))
    plan = f" (plan {copilot.sku})" if copilot.sku else ""
    print(f"Copilot:        OK{plan}")
    print(f"Copilot API:    {copilot.endpoints_api}")
    print(f"Copilot token:  expires {expiry:%Y-%m-%d %H:%M %Z} (in {minutes} min)")
    return "GitHub Copilot"


# -- demo ------------------------------------------------------------------------------------------
def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--notebook", metavar="PATH",
        help="the notebook to run (default: notebooks/quickstart.ipynb of this checkout)",
    )
    parser.add_argument(
        "-m", "--model", metavar="SPEC",
        help="model for every %%%%chat cell (default: the best available: DISPATCH_NB_MODEL, a "
        "Copilot login, an API key, else the embedded local model)",
    )
    parser.add_argument(
        "--cache", choices=("off", "read-write", "replay", "record"), default="off",
        help="response cache mode (default: off, so the model really answers)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, metavar="SECONDS",
        help="the longest one cell may take (default: 600)",
    )


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.notebook, model=args.model, cache=args.cache, timeout=args.timeout)


#: every subcommand, in the order ``--help`` lists them: (one-line help, handler, its options)
COMMANDS: dict[str, tuple[str, Handler, Arguments]] = {
    "login": ("Log in to GitHub Copilot with GitHub's device flow.", _login, _login_arguments),
    "logout": ("Remove the GitHub token saved by login.", _logout, _logout_arguments),
    "status": ("Show every provider dispatch_nb could use here (Copilot, OpenAI, Anthropic, the "
               "embedded model) and which model runs by default; exit 0 when any would work.",
               _status, _status_arguments),
    "demo": ("Run the quickstart notebook end to end in a Jupyter kernel, printing each prompt and "
             "answer.", _demo, _demo_arguments),
}

if __name__ == "__main__":
    sys.exit(main())
