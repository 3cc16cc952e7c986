"""``%%chat`` and ``%chat``: the IPython magics and their traits (``docs/notebook.md``). Loading
imports only IPython, traitlets and ``constants`` / ``state``; the rest waits for the first magic.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Callable
from typing import Any, TypeVar, cast

from IPython.core import magic_arguments as _magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from traitlets import Bool, CaselessStrEnum, Float, Int, Unicode, default

from .constants import CACHE_MODES, FORMATS, LIVE_MODES, SUBCOMMANDS
from .state import KernelState

__all__ = ["ChatMagics", "load_ipython_extension", "unload_ipython_extension"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _arg(*flags: str, **settings: Any) -> Any:
    """One option of a magic: IPython's ``magic_arguments.argument``."""
    return _magic_arguments.argument(*flags, **settings)  # type: ignore[no-untyped-call]


def _magic(kind: Any, name: str, *options: Any) -> Callable[[_F], _F]:
    """IPython's ``kind`` (``cell_magic("chat")`` / ``line_magic("chat")``) over its
    ``@magic_arguments(name)`` with one ``@argument`` per option, in the order given (the order the
    help lists them); typed to keep the decorated method's type."""

    def decorate(func: _F) -> _F:
        for option in reversed(options):  # the decorator nearest the function is applied first
            func = option(func)
        return cast(_F, kind(_magic_arguments.magic_arguments(name=name)(func)))  # type: ignore[no-untyped-call]

    return decorate


def usage_line(parser: Any) -> str:
    """``usage: %%chat [-m SPEC] ...`` (without the reST ``::`` IPython's formatter adds)."""
    return "usage: " + " ".join(parser.format_usage().replace("::", "").split())


def _hint(parser: Any, argv: list[str], message: str) -> str:
    """What to add to argparse's ``message``: `` (did you mean --temperature?)`` for options it did
    not recognize that are close to one the magic has (``--temprature``), or a choice close to one
    it offers (``%chat sttus``: status); `` (a value with spaces goes in quotes: -m "a, b")`` when
    the words it did not recognize are no options but the rest of the value before them (``-m a,
    b``, ``%chat history my thread``); ``""`` otherwise."""
    import difflib
    import re

    choice = re.search(r"invalid choice: '?([^' ]*)'? \(choose from (.*)\)", message)
    if choice is not None:  # the choices quoted or not (Python versions differ)
        offered = [c.strip("'") for c in choice.group(2).split(", ")]
        close = difflib.get_close_matches(choice.group(1), offered, n=1, cutoff=0.6)
        return f" (did you mean {close[0]}?)" if close else ""
    unknown = re.search(r"unrecognized arguments: (.*)", message)
    words = unknown.group(1).split() if unknown is not None else []
    if any(word.startswith("-") for word in words):
        options = re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", parser.format_help())  # long names too
        guesses = [
            close[0]
            for word in words
            if word.startswith("-")
            and (close := difflib.get_close_matches(word.split("=")[0], options, n=1, cutoff=0.7))
        ]
        return f" (did you mean {' / '.join(dict.fromkeys(guesses))}?)" if guesses else ""
    first = next((i for i in range(len(argv) - len(words), 0, -1)
                  if argv[i : i + len(words)] == words), 0)
    if not words or first == 0 or argv[first - 1].startswith("-"):
        return ""
    value = " ".join(argv[first - 1 : first + len(words)])
    option = f"{argv[first - 2]} " if first >= 2 else ""
    return f' (a value with spaces goes in quotes: {option}"{value}")'


def parse_magic_line(parser: Any, line: str) -> Any:
    """Parse a magic's option line the way a shell would (``shlex.split``: IPython's own
    ``parse_argstring`` keeps the quotes); errors are ``UsageError`` s with the usage line."""
    try:
        argv = shlex.split(line, posix=True)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise UsageError(
            f"cannot read the options ({str(exc).lower()}): {line.strip()}\n{usage_line(parser)}"
        ) from None
    try:
        return parser.parse_args(argv)
    except UsageError as exc:  # argparse's message, a guess for a misspelt option, the usage
        raise UsageError(f"{exc}{_hint(parser, argv, str(exc))}\n{usage_line(parser)}") from None


@magics_class
class ChatMagics(Magics):
    """The ``%%chat`` cell magic and the ``%chat`` line magic (see ``docs/notebook.md``)."""

    #: the approval asker that was installed before ``%load_ext`` (put back by ``%unload_ext``)
    previous_asker: Any = None

    model = Unicode(
        "",
        help="Default model spec ('provider:model'). Empty: $DISPATCH_NB_MODEL, else the built-in "
        "default (see %chat status).",
    ).tag(config=True)
    system = Unicode("", help="Default system prompt for %%chat cells.").tag(config=True)
    stream = Bool(True, help="Stream answers live (False: wait for the whole answer).").tag(config=True)
    history_length = Int(
        20,
        help="The most turns a thread keeps (and sends as context); older turns are dropped. "
        "0 keeps every turn.",
    ).tag(config=True)
    thread = Unicode("default", help="The thread %%chat cells use when -t is not given.").tag(config=True)
    cache = CaselessStrEnum(
        ("", *CACHE_MODES),
        default_value="",
        help="Response cache mode: off, read-write, replay or record. Empty: $DISPATCH_NB_CACHE, "
        "else off.",
    ).tag(config=True)
    cache_file = Unicode(
        "",
        help="The response cache file. Empty: $DISPATCH_NB_CACHE_FILE, else "
        "<notebook>.dispatch-cache.jsonl beside the notebook, else dispatch-cache.jsonl.",
    ).tag(config=True)
    format = CaselessStrEnum(
        FORMATS, default_value="markdown", help="Default output format (-f)."
    ).tag(config=True)
    live = CaselessStrEnum(
        LIVE_MODES,
        help="Live view: auto (widgets in a kernel that has ipywidgets, display updates in other "
        "kernels, plain text in a terminal), widget, display or text. Default: $DISPATCH_NB_LIVE "
        "or auto.",
    ).tag(config=True)
    interpolate = Bool(
        True, help="Replace {expression} in prompts with values from the namespace."
    ).tag(config=True)
    max_value_chars = Int(
        4000, help="The most characters one interpolated value may take in a prompt."
    ).tag(config=True)
    max_rows = Int(10, help="Rows of an interpolated DataFrame shown in a prompt.").tag(config=True)
    max_tokens = Int(None, allow_none=True, help="Default --max-tokens (None: the model's).").tag(config=True)
    temperature = Float(None, allow_none=True, help="Default --temperature.").tag(config=True)
    timeout = Float(
        None, allow_none=True, help="Total seconds one answer may take (None: no deadline)."
    ).tag(config=True)
    max_tool_rounds = Int(8, help="Tool-calling rounds one --tools cell may run.").tag(config=True)
    update_rate = Float(20.0, help="The most live-view updates per second.").tag(config=True)
    confirm_rows = Int(
        1000, help="%%chat --each over more rows than this shows the row count and the estimate "
        "and waits for a confirmation (--yes skips it, --limit N runs the first N rows).",
    ).tag(config=True)
    login_on_demand = Bool(
        True,
        help="When a %%chat cell needs a GitHub Copilot login, show the login and continue.",
    ).tag(config=True)

    login_min_interval = Float(
        1.0,
        help="The shortest wait between two device-login polls (GitHub's interval wins when "
        "longer).",
    ).tag(config=True)

    @default("live")
    def _default_live(self) -> str:
        value = os.environ.get("DISPATCH_NB_LIVE", "").strip().lower()
        return value if value in LIVE_MODES else "auto"

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        #: the kernel's notebook state (adapters, caches, threads, ``Err``, the running cell);
        #: the modules that run cells and commands receive it
        self.state = KernelState(shell, self)

    # -- magics ----------------------------------------------------------------------------------
    @_magic(
        cell_magic("chat"),
        "%chat",
        _arg("-m", "--model", metavar="SPEC", help="Model spec 'provider:model' (default: "
             "ChatMagics.model). Several, comma-separated (-m a,b,c), compare the models side by side."),
        _arg("-s", "--system", metavar="SYSTEM", help="System prompt for this cell."),
        _arg("-t", "--thread", metavar="THREAD", help="Conversation thread (default: ChatMagics.thread)."),
        _arg("--new", action="store_true", help="Start the thread afresh with this cell."),
        _arg("--max-tokens", type=int, metavar="N", help="Most tokens to generate."),
        _arg("--temperature", type=float, metavar="T", help="Sampling temperature."),
        _arg("--tools", metavar="NAMES", help="Comma-separated functions from the namespace the model "
             "may call (@tool or typed functions)."),
        _arg("--mcp", metavar="NAMES", help="Comma-separated MCP servers whose tools the model may call "
             "(%%chat mcp add, or mcp.json)."),
        _arg("--approve", choices=("auto", "ask"), type=str.lower, metavar="auto|ask",
             help="Run tool calls at once (auto) or ask first (ask; the default for MCP tools)."),
        _arg("--context", metavar="NAMES", help="Comma-separated variables the model may read (never "
             "run) through describe() and list_variables()."),
        _arg("-f", "--format", choices=FORMATS, type=str.lower, metavar="markdown|text|code|json",
             help="markdown (default), text, code (into the next cell) or json."),
        _arg("-o", "--output", metavar="VAR",
             help="Store the Response in this variable (with --each: the BatchResult)."),
        _arg("--schema", metavar="NAME", help="Ask for a structured answer: a pydantic model class, a "
             "type (list[Review]) or a JSON Schema dict from the namespace; shown as a table, .parsed "
             "on the Response."),
        _arg("--each", metavar="NAME", help="Run the prompt once per row of a list, Series or DataFrame "
             "from the namespace ({column} is the row's value); shows a result table."),
        _arg("--deferred", action="store_true", help="With --each: send the rows as a provider batch "
             "job (OpenAI, Anthropic: half the price, answered within 24 h); re-running the cell "
             "collects the job."),
        _arg("--checkpoint", metavar="FILE", help="With --each: record each row (and a deferred job) "
             "in FILE; a re-run sends only the rows not answered there."),
        _arg("--budget", type=float, metavar="USD", help="--each: US dollars the rows may spend; a row "
             "whose worst case does not fit is not sent (BudgetExceededError)."),
        _arg("--limit", type=int, metavar="N", help="--each: run the first N rows only."),
        _arg("--yes", action="store_true",
             help="--each: run a large batch without asking first (see ChatMagics.confirm_rows)."),
        _arg("--estimate", action="store_true",
             help="Show what the cell would cost (tokens, USD range) without sending anything."),
        _arg("--no-stream", action="store_true", help="Wait for the whole answer instead of streaming."),
        _arg("--no-history", action="store_true",
             help="Send no earlier turns, and do not record this one."),
        _arg("--no-interpolate", action="store_true", help="Send {braces} literally."),
        _arg("--cache", choices=CACHE_MODES, type=str.lower, metavar="MODE",
             help="Response cache: off, read-write, replay or record (default: ChatMagics.cache)."),
    )
    def chat_cell(self, line: str, cell: str) -> None:
        """Send the cell to a language model and stream the answer.

        The cell is the prompt; ``{name}`` / ``{expression}`` are replaced by values from the
        namespace (``{{`` for a literal brace), including ``{In[3]}``, ``{Out[3]}`` and
        ``{Err[3]}`` (the exception cell 3 raised). Re-running a cell replaces its turn in the
        thread. Examples::

            %%chat -m openai:gpt-4.1 -s "Answer in one sentence."
            What does {df.shape} tell us about {name}?

            %%chat -m copilot:gpt-4.1,anthropic:claude-sonnet-4-5     (compare side by side)
            %%chat --tools get_weather -o answer                        (tool calling)
            %%chat -f code                                              (code into the next cell)
            %%chat --schema list[Review] -o reviews                     (a table of objects)
            %%chat --each df -o result                                  (one answer per row)
            %%chat --each df --deferred -o result                       (as a batch job)
        """
        parser: Any = self.chat_cell.parser  # type: ignore[attr-defined]
        args = parse_magic_line(parser, line)
        from .cell import run_chat_cell  # the entry point of a cell run: not at %load_ext

        run_chat_cell(self.state, args, cell)

    @_magic(
        line_magic("chat"),
        "chat",
        _arg("command", choices=SUBCOMMANDS, help="What to do."),
        _arg("target", nargs="?", default=None,
             help="PROVIDER for login/models/key; THREAD for history/reset."),
        _arg("--all", action="store_true", help="reset: clear every thread."),
        _arg("--force", action="store_true", help="login: log in again even when already logged in."),
    )
    def chat_line(self, line: str) -> None:
        """Manage dispatch_nb: ``login [PROVIDER] [--force]``, ``logout``, ``status``,
        ``models [PROVIDER]``, ``history [THREAD]``, ``reset [THREAD]``, ``key PROVIDER`` (type an
        API key; it is kept in this kernel's environment only), ``cost``, ``mcp add|list|remove``
        (MCP servers). Prompts go in a ``%%chat`` cell."""
        parser: Any = self.chat_line.parser  # type: ignore[attr-defined]
        if line.split()[:1] == ["mcp"]:
            from .mcp_servers import mcp_command  # not at %load_ext

            mcp_command(line.strip()[3:])
            return
        if not line.strip():
            raise UsageError(
                "%chat needs a command: " + ", ".join(SUBCOMMANDS) + ". Prompts go in a "
                "%%chat cell.\n" + usage_line(parser)
            )
        args = parse_magic_line(parser, line)
        from .commands import run  # not at %load_ext

        run(self.state, args)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext dispatch_nb``: register the magics, ``Err`` and the cell hooks."""
    if getattr(ipython, "_dispatch_nb_magics", None) is not None:
        return
    magics = ChatMagics(shell=ipython)
    state = magics.state
    ipython.register_magics(magics)
    # pre_run_cell remembers the running cell's id; post_run_cell stores its exception as Err[n]
    ipython.events.register("pre_run_cell", state.begin_cell)
    ipython.events.register("post_run_cell", state.end_cell)
    ipython.user_ns.setdefault("Err", state.errors)
    ipython.user_ns_hidden.setdefault("Err", state.errors)
    ipython._dispatch_nb_magics = magics
    from ..approval import set_asker

    # approve="ask" asks in the cell, also for a Session used in a cell (until %unload_ext)
    magics.previous_asker = set_asker(_ask_in_cell)


def _ask_in_cell(call: Any, seconds: float | None) -> bool | str:
    """``approve="ask"`` in this kernel: ``notebook/approval.py``, imported when first asked."""
    from .approval import ask

    return ask(call, seconds)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext dispatch_nb``: remove the hooks and magics, close connections."""
    magics = getattr(ipython, "_dispatch_nb_magics", None)
    if magics is None:
        return
    state = magics.state
    for event, callback in (("pre_run_cell", state.begin_cell), ("post_run_cell", state.end_cell)):
        with contextlib.suppress(ValueError):
            ipython.events.unregister(event, callback)
    for kind, name in (("cell", "chat"), ("line", "chat")):
        ipython.magics_manager.magics[kind].pop(name, None)
    if magics in getattr(ipython, "configurables", []):
        ipython.configurables.remove(magics)
    if ipython.user_ns.get("Err") is state.errors:
        del ipython.user_ns["Err"]
        ipython.user_ns_hidden.pop("Err", None)
    state.close_adapters()
    from ..approval import set_asker

    set_asker(magics.previous_asker)
    del ipython._dispatch_nb_magics
