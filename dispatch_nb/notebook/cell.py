"""One ``%%chat`` execution, start to finish.

1. Build the prompt (``prompt.py``) and pick the thread and the cell's turn key (``threads.py``).
2. Get an adapter per model (cached per kernel; a Copilot model without a login first shows the
   device-login view, ``login.py``; ``--cache`` wraps it in the response cache).
3. Run one :class:`~dispatch_nb.notebook.runner.Job` per model on worker threads; the kernel's
   thread feeds the live view (``live.py``).
4. Replace the live view with one static output (``display.py``), record the turn, store ``-o``,
   put ``-f code`` into the next cell, and raise a short :class:`ChatError` /
   :class:`ChatInterrupted` if something went wrong — after the partial answer is shown.

This module is imported on the first ``%%chat``, never by ``%load_ext``.
"""

from __future__ import annotations

import argparse
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from ..cancel import CancelToken
from ..errors import DispatchError, RequestCancelled
from ..types import (
    ErrorEvent,
    Message,
    MessageDoneEvent,
    Response,
    StreamDelta,
    TextBlock,
    ToolResultBlock,
    ToolResultEvent,
    ToolUseBlock,
    Usage,
)
from ..validation import replace_lone_surrogates, surrogate_note
from .display import (
    ChatError,
    ChatInterrupted,
    CompareEntry,
    FinalOutput,
    compare_output,
    explain_error,
    final_output,
    parsed_output,
)
from .live import detect_mode, has_kernel, make_view
from .prompt import PromptError, build_prompt
from .runner import Job, JobOutcome, RetryEvent, run_jobs
from .threads import cell_identity, cell_key, turn_from

if TYPE_CHECKING:
    from ..adapter import Adapter
    from .magics import ChatMagics

__all__ = ["default_spec", "get_adapter", "run_chat_cell"]


# ------------------------------------------------------------------------------------------------
# models and adapters


def default_spec(magics: ChatMagics) -> tuple[str, str]:
    """The default model spec and why it was chosen."""
    spec, reason, _hint = resolve_default(magics)
    return spec, reason


def resolve_default(magics: ChatMagics) -> tuple[str, str, str]:
    """The default model spec, why it was chosen, and a hint for the user (or ``""``)."""
    if magics.model.strip():
        return magics.model.strip(), "%config ChatMagics.model", ""
    from ..defaults import resolve_default_model

    resolved = resolve_default_model()
    return resolved.spec, resolved.reason, resolved.login_hint


def split_specs(value: str | None, magics: ChatMagics) -> list[str]:
    """``-m a,b,c`` → ``["a", "b", "c"]``; nothing → the default model."""
    if not value or not value.strip():
        return [resolve_default(magics)[0]]
    specs = [s.strip() for s in value.split(",") if s.strip()]
    if not specs:
        raise UsageError("-m needs a model spec, e.g. -m openai:gpt-4.1")
    if len(set(specs)) != len(specs):
        raise UsageError(f"-m lists a model twice: {value}")
    return specs


def cache_mode(magics: ChatMagics, requested: str | None) -> str:
    """The cache mode in force: ``--cache``, else ``ChatMagics.cache``, else ``$DISPATCH_NB_CACHE``."""
    from ..cache import resolve_cache_mode

    return resolve_cache_mode(requested or magics.cache or None)


def get_adapter(magics: ChatMagics, spec: str, mode: str = "off") -> Adapter:
    """The adapter for ``spec`` (cached per kernel), behind the response cache unless ``off``."""
    key = (spec, mode)
    cached: Adapter | None = magics._adapters.get(key)
    if cached is not None:
        return cached
    from ..registry import parse_model_spec
    from ..replay_only import connect_for_cache

    provider, _model = parse_model_spec(spec)
    if provider == "copilot" and magics.login_on_demand and mode != "replay":
        ensure_copilot_login(magics)  # replay sends nothing, so it needs no login
    adapter = connect_for_cache(spec, mode)  # replay needs no model (nor its extra) either
    if mode != "off":
        from ..cache import CachedAdapter, ResponseCache

        cache = magics._caches.get(mode)
        if cache is None:
            cache = magics._caches[mode] = ResponseCache(magics.cache_file or None, mode)
        adapter = CachedAdapter(adapter, cache)
    magics._adapters[key] = adapter
    return adapter


def was_replayed(adapter: Adapter) -> bool:
    """True when every call ``adapter`` (a cell's :func:`labelled` adapter) made was answered
    from the response cache — replay, or a read-write hit — so the answer has no real latency."""
    from ..cache import CachedAdapter

    return (
        isinstance(adapter, CachedAdapter)
        and adapter.replayed_calls > 0
        and adapter.model_calls == 0
    )


def labelled(adapter: Adapter, label: str) -> Adapter:
    """A cached adapter that names ``label`` (e.g. ``In[3]``) in what it records and misses."""
    from ..cache import CachedAdapter

    return adapter.with_label(label) if isinstance(adapter, CachedAdapter) else adapter


def ensure_copilot_login(magics: ChatMagics) -> None:
    """Show the device login when no GitHub token is available; raise ChatError if it fails."""
    from ..auth.token_store import find_github_token

    if find_github_token() is not None:
        return
    from .login import run_login

    run_login(magics, reason="This cell uses GitHub Copilot, which needs a GitHub login.")


# ------------------------------------------------------------------------------------------------
# tools


def resolve_tools(names: str | None, namespace: dict[str, Any]) -> list[Any]:
    """``--tools f,g`` → tool objects from the namespace (``@tool`` objects or typed functions)."""
    if not names:
        return []
    from ..tools import Tool, tool

    out: list[Any] = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in namespace:
            raise ChatError(
                "Unknown tool", f"there is no {name!r} in the namespace", "Define the function first."
            )
        obj = namespace[name]
        if isinstance(obj, Tool):
            out.append(obj)
        elif callable(obj):
            try:
                out.append(tool(obj))
            except (TypeError, ValueError) as exc:
                raise ChatError("Tool error", f"{name}: {exc}", "Add type hints, or use @tool.") from None
        else:
            from ..validation import article

            raise ChatError("Tool error", f"{name} is {article(type(obj).__name__)}, not a function")
    return out


# ------------------------------------------------------------------------------------------------
# --schema

SCHEMA_ACCEPTED = (
    "--schema takes a pydantic model class, a type such as list[Review], a TypedDict or a "
    "dataclass, or a JSON Schema dict, from the namespace"
)


def resolve_schema(expression: str | None, namespace: dict[str, Any]) -> Any:
    """``--schema NAME`` → a checked :class:`~dispatch_nb.structured.StructuredOutput` (None
    without the option). ``NAME`` may be an expression such as ``list[Review]``, evaluated in the
    namespace. A missing name or a value that is not a schema is a ``UsageError`` saying what is
    accepted; the schema is built and checked here, before anything is sent."""
    if expression is None:
        return None
    expression = expression.strip()
    if not expression:
        raise UsageError(f"--schema needs a name: {SCHEMA_ACCEPTED}")
    try:
        value = eval(expression, namespace)  # the user's own expression, in their kernel
    except NameError as exc:
        raise UsageError(f"--schema {expression}: {exc}. {SCHEMA_ACCEPTED}.") from None
    except Exception as exc:
        raise UsageError(
            f"--schema {expression} could not be evaluated ({type(exc).__name__}: {exc}). "
            f"{SCHEMA_ACCEPTED}."
        ) from None
    import typing

    from ..structured import StructuredOutput, as_output

    schema_like = (
        isinstance(value, (type, dict, StructuredOutput))
        or typing.get_origin(value) is not None
    )
    if not schema_like:
        from ..validation import article

        raise UsageError(
            f"--schema {expression} is {article(type(value).__name__)}, not a schema. "
            f"{SCHEMA_ACCEPTED}."
        )
    try:
        return as_output(value)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--schema {expression}: {exc}. {SCHEMA_ACCEPTED}.") from None


# ------------------------------------------------------------------------------------------------
# the work each model does (on a worker thread)


def response_events(response: Response) -> list[StreamDelta]:
    """The deltas a streamed call would have produced for ``response`` (for ``--no-stream``):
    :meth:`Response.deltas <dispatch_nb.types.Response.deltas>`."""
    return response.deltas()


def exchange_events(produced: list[Message], last: Response, total: Usage) -> list[Any]:
    """The events a streamed tool loop would have produced for the messages of a finished turn
    (``--no-stream --tools``): each model round's deltas and a ``MessageDoneEvent``, each tool's
    ``ToolResultEvent``. Per-round usage is not kept in the history, so the earlier rounds count
    no tokens and the last round (``last``) carries ``total``, the whole turn's usage."""
    final = last.model_copy(update={"usage": total})
    rounds = [m for m in produced if m.role == "assistant"]
    if not last.content:  # an empty final answer is not added to the history
        rounds.append(Message(role="assistant", content=[]))
        produced = [*produced, rounds[-1]]
    events: list[Any] = []
    names: dict[str, str] = {}
    for message in produced:
        content = message.content
        blocks = [TextBlock(text=content)] if isinstance(content, str) else list(content)
        if message.role == "assistant":
            if message is rounds[-1]:
                reply = final
            else:
                reply = Response(content=blocks, model=last.model, stop_reason="tool_use")
            for block in blocks:
                if isinstance(block, ToolUseBlock):
                    names[block.id] = block.name
            events.extend(reply.events())
        else:
            for block in blocks:
                if isinstance(block, ToolResultBlock):
                    events.append(
                        ToolResultEvent(result=block, tool_name=names.get(block.tool_use_id, ""))
                    )
    return events


@dataclass
class CallPlan:
    """What one model is asked to do."""

    spec: str
    adapter: Adapter
    history: list[Message]
    user: Message
    system: str | None
    max_tokens: int | None
    temperature: float | None
    timeout: float | None
    stream: bool
    tools: list[Any]
    max_tool_rounds: int
    #: ``--schema``: the StructuredOutput the answer must match (None: plain text)
    output: Any = None


@dataclass
class CallResult:
    """A finished call: the last response and every message produced (for the thread)."""

    response: Response
    produced: list[Message]


def make_work(plan: CallPlan) -> Callable[[Callable[[Any], None], CancelToken], CallResult]:
    """The function a worker thread runs for ``plan``."""
    options: dict[str, Any] = {}
    if plan.max_tokens is not None:
        options["max_tokens"] = plan.max_tokens
    if plan.temperature is not None:
        options["temperature"] = plan.temperature
    if plan.timeout is not None:
        options["timeout"] = plan.timeout
    if plan.output is not None:
        options["output"] = plan.output

    def plain(emit: Callable[[Any], None], cancel: CancelToken) -> CallResult:
        messages = [*plan.history, plan.user]
        if plan.stream:
            stream = plan.adapter.stream(messages, system=plan.system, cancel=cancel, **options)
            attempt = 1
            with stream:
                for delta in stream:
                    now = getattr(stream, "attempt", 1)  # --schema: a retry's deltas follow
                    if now != attempt:
                        attempt = now
                        emit(RetryEvent(reason="the answer did not match the schema",
                                        attempt=now - 1))
                        emit(StreamDelta(type="text_delta", text="\n\n"))
                    emit(delta)
            response = stream.response
        else:
            response = plan.adapter.chat(
                messages, system=plan.system, cancel=cancel, stream=False, **options
            )
            for delta in response_events(response):
                emit(delta)
        assert response is not None
        return CallResult(response, [response.to_message()])

    def with_tools(emit: Callable[[Any], None], cancel: CancelToken) -> CallResult:
        from ..session import Session

        session = Session(
            plan.adapter,
            system=plan.system,
            tools=plan.tools,
            max_tool_rounds=plan.max_tool_rounds,
            max_tokens=plan.max_tokens,
            temperature=plan.temperature,
        )
        session.history = list(plan.history)
        start = len(session.history)
        last: Response | None = None
        extra: dict[str, Any] = {"cancel": cancel}
        if plan.timeout is not None:
            extra["timeout"] = plan.timeout
        if plan.output is not None:
            extra["output"] = plan.output
        if not plan.stream:
            # --no-stream: one non-streaming send runs the whole tool loop; then the exchange
            # (calls, results, answer) is shown once, from what the turn added to the history.
            last = session.send(plan.user.content, stream=False, **extra)
            produced = list(session.history[start + 1 :])
            for event in exchange_events(produced, last, session.usage):
                emit(event)
            return CallResult(last, produced)
        for event in session.stream(plan.user.content, **extra):
            if isinstance(event, ErrorEvent):
                raise event.error
            if isinstance(event, MessageDoneEvent):
                last = event.response
            emit(event)
        if last is None:
            raise RequestCancelled("the session ended without an answer")
        produced = list(session.history[start + 1 :])
        return CallResult(last, produced)

    return with_tools if plan.tools else plain


# ------------------------------------------------------------------------------------------------
# the cell


INTERRUPTED = "interrupted"


def _partial_response(outcome: JobOutcome) -> Response | None:
    error = outcome.error
    if isinstance(error, DispatchError):
        return error.partial
    return None


def _response_of(outcome: JobOutcome, transcript: Any) -> Response | None:
    """The answer a job ended with: its result, else the partial answer of its error, else
    what the transcript shows (a job abandoned while a tool ran)."""
    if isinstance(outcome.result, CallResult):
        return outcome.result.response
    partial = _partial_response(outcome)
    if partial is not None:
        return partial
    text = transcript.text
    if not text:
        return None
    usage = transcript.usage or Usage()
    return Response(content=[TextBlock(text=text)], model=transcript.model or "", usage=usage)


def _clean(text: str, where: str, notes: list[str]) -> str:
    cleaned, count = replace_lone_surrogates(text)
    if count:
        notes.append(surrogate_note(count, where))
    return cleaned


def _check_output_name(name: str | None) -> None:
    if name is None:
        return
    if not name.isidentifier() or keyword.iskeyword(name):
        raise UsageError(
            f"-o needs a Python variable name (letters, digits and _, not starting with a digit), "
            f"not {name!r}"
        )


def run_chat_cell(magics: ChatMagics, args: argparse.Namespace, line: str, cell: str) -> None:
    """Run one ``%%chat`` cell (see the module docstring)."""
    shell = magics.shell
    assert shell is not None
    namespace = shell.user_ns
    fmt = args.format or magics.format
    interpolate = magics.interpolate and not args.no_interpolate
    _check_output_name(args.output)
    if args.each is not None:
        from .each import run_each_cell

        run_each_cell(magics, args, cell)
        return
    try:
        prompt = build_prompt(
            cell,
            namespace,
            interpolate=interpolate,
            max_chars=magics.max_value_chars,
            max_rows=magics.max_rows,
        )
    except PromptError as exc:
        raise explain_error(exc) from None
    text = re.sub(r"\A(?:[ \t]*\n)+", "", prompt.text).rstrip()  # surrounding blank lines
    if not text:
        raise UsageError("the %%chat cell is empty: write the prompt below the %%chat line")
    text = _clean(text, "the prompt", prompt.notes)

    if args.temperature is not None and not 0 <= args.temperature <= 2:
        raise UsageError(f"--temperature must be between 0 and 2, not {args.temperature}")
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise UsageError(f"--max-tokens must be a positive integer, not {args.max_tokens}")
    specs = split_specs(args.model, magics)
    if not args.model and not magics.model.strip():
        hint = resolve_default(magics)[2]
        if hint:
            prompt.notes.append(hint)
    compare = len(specs) > 1
    tools = resolve_tools(args.tools, namespace)
    schema = resolve_schema(args.schema, namespace)
    if schema is not None and args.format in ("code", "text"):
        raise UsageError(f"--schema shows the answer as a table: -f {args.format} does not apply")
    mode = cache_mode(magics, args.cache)
    stream = magics.stream and not args.no_stream
    system = args.system if args.system is not None else (magics.system or None)
    if system is not None:
        system = _clean(system, "the system prompt", prompt.notes)

    # Conversation memory.
    thread_name = args.thread or magics.thread
    thread = magics.threads.get(thread_name)
    if args.new:
        thread.clear()
    identity = cell_identity(magics.cell_id, magics.execution_count)
    key = cell_key(identity, magics.next_occurrence(f"{thread_name}\n{identity}"))
    use_history = not args.no_history
    history = thread.history_for(key) if use_history else []
    user = Message(role="user", content=text)

    # Adapters (a Copilot model may show the login first).
    adapters: list[Adapter] = []
    label = f"In[{magics.execution_count}]" if magics.execution_count is not None else "%%chat"
    for spec in specs:
        try:
            adapters.append(labelled(get_adapter(magics, spec, mode), label))
        except (DispatchError, ImportError) as exc:
            raise explain_error(exc, spec=spec) from None

    plans = [
        CallPlan(
            spec=spec,
            adapter=adapter,
            history=history,
            user=user,
            system=system,
            max_tokens=args.max_tokens if args.max_tokens is not None else magics.max_tokens,
            temperature=args.temperature if args.temperature is not None else magics.temperature,
            timeout=magics.timeout,
            stream=stream,
            tools=tools,
            max_tool_rounds=magics.max_tool_rounds,
            output=schema,
        )
        for spec, adapter in zip(specs, adapters, strict=True)
    ]
    jobs = [Job(name=plan.spec, work=make_work(plan)) for plan in plans]

    live_mode = detect_mode(shell, magics.live)
    view = make_view(live_mode, specs, rate=magics.update_rate, in_kernel=has_kernel(shell))
    view.start(prompt.notes)

    def on_done(index: int, outcome: JobOutcome) -> None:
        transcript = view.transcripts[index]
        transcript.replayed = outcome.error is None and was_replayed(plans[index].adapter)
        result = outcome.result
        if isinstance(result, CallResult):
            transcript.finish(result.response)
        else:
            transcript.finish(_partial_response(outcome))
        error = None
        if outcome.error is not None:
            error = INTERRUPTED if isinstance(outcome.error, RequestCancelled) else str(outcome.error)
        view.job_done(index, transcript.footer(outcome.latency), error)

    interrupted = False
    try:
        try:
            run_jobs(jobs, view.feed, tick=view.tick, on_done=on_done, on_interrupt=view.interrupt)
        except KeyboardInterrupt:
            interrupted = True
    except BaseException:
        view.close()
        raise

    outcomes = [job.outcome for job in jobs]
    extra = {"thread": None if (compare or not use_history) else thread_name, "live": view.mode}
    context = {"history_turns": len(thread) if use_history else 0, "no_history": args.no_history}

    if compare:
        entries = []
        for spec, transcript, outcome in zip(specs, view.transcripts, outcomes, strict=True):
            error = None
            if outcome.error is not None:
                if isinstance(outcome.error, RequestCancelled):
                    error = INTERRUPTED
                else:
                    error = explain_error(outcome.error, spec=spec, context=context).message
            entries.append(
                CompareEntry(
                    spec=spec,
                    transcript=transcript,
                    latency=outcome.latency if outcome.ended else None,
                    ttft=outcome.time_to_first_output,
                    error=error,
                )
            )
        parsed = None
        if schema is not None:
            parsed = [_parsed_response(o) for o in outcomes]
        final = compare_output(entries, extra=extra, notes=_all_notes(prompt.notes, view),
                               parsed=parsed)
    elif schema is not None and _parsed_response(outcomes[0]) is not None and not interrupted:
        outcome = outcomes[0]
        response = _parsed_response(outcome)
        assert response is not None
        final = parsed_output(
            view.transcripts[0],
            response,
            latency=outcome.latency if outcome.ended else None,
            ttft=outcome.time_to_first_output,
            extra={**extra, "schema": args.schema.strip()},
            notes=_all_notes(prompt.notes, view),
        )
    else:
        outcome = outcomes[0]
        note = None
        if interrupted or isinstance(outcome.error, RequestCancelled):
            note = "⏹ " + INTERRUPTED
        elif outcome.error is not None:
            note = f"⚠ {type(outcome.error).__name__}"
        final = final_output(
            view.transcripts[0],
            fmt=fmt,
            latency=outcome.latency if outcome.ended else None,
            ttft=outcome.time_to_first_output,
            extra=extra,
            note=note,
            notes=_all_notes(prompt.notes, view),
            failed=interrupted or outcome.error is not None,
        )
    view.finish(final)

    _after(magics, args, final, plans, outcomes, view.transcripts, thread, key, use_history,
           compare, fmt)

    if interrupted:
        raise ChatInterrupted(_interrupted_message(view)) from None
    failures = [
        (spec, o.error) for spec, o in zip(specs, outcomes, strict=True) if o.error is not None
    ]
    if failures and not compare:
        failed_spec, failure = failures[0]
        if isinstance(failure, RequestCancelled):
            raise ChatInterrupted(_interrupted_message(view)) from None
        if not isinstance(failure, (DispatchError, ChatError)):
            raise failure
        available = _available_models(plans[0])
        raise explain_error(failure, spec=failed_spec, available=available, context=context) from None
    if failures and len(failures) == len(specs):
        failed_spec, failure = failures[0]
        raise explain_error(failure, spec=failed_spec, context=context) from None


def _parsed_response(outcome: JobOutcome) -> Response | None:
    """The structured answer a job ended with (None when it failed)."""
    if outcome.error is None and isinstance(outcome.result, CallResult):
        return outcome.result.response
    return None


def _all_notes(notes: list[str], view: Any) -> list[str]:
    """The prompt's notes plus the warnings logged while the answers streamed."""
    out = list(notes)
    for transcript in view.transcripts:
        out += [n for n in transcript.log_notes if n not in out]
    return out


def _interrupted_message(view: Any) -> str:
    kept = any(not t.empty for t in view.transcripts)
    return INTERRUPTED + ("; the partial answer is kept above" if kept else "")


def _available_models(plan: CallPlan) -> list[str]:
    try:
        return [m.id for m in plan.adapter.list_models()]
    except Exception:
        return []


def _after(
    magics: ChatMagics,
    args: argparse.Namespace,
    final: FinalOutput,
    plans: list[CallPlan],
    outcomes: list[JobOutcome],
    transcripts: list[Any],
    thread: Any,
    key: str,
    use_history: bool,
    compare: bool,
    fmt: str,
) -> None:
    """Record the turn, store ``-o VAR`` and ``Out[n]``, send ``-f code`` to the next cell.

    ``-o`` always stores something: the answer, the partial answer of an interrupted or failed
    cell (when anything arrived), and in a comparison each model's answer or the error it ended
    with."""
    shell = magics.shell
    assert shell is not None
    count = magics.execution_count
    results = [o.result if isinstance(o.result, CallResult) else None for o in outcomes]
    def stored(index: int) -> Any:
        outcome = outcomes[index]
        if outcome.error is None:
            return _response_of(outcome, transcripts[index])
        if isinstance(outcome.error, RequestCancelled):  # Ctrl-C: what arrived, if anything did
            return _response_of(outcome, transcripts[index]) or outcome.error
        return outcome.error  # a failure: the error (its .partial holds what arrived)

    if compare:
        if args.output:
            shell.user_ns[args.output] = {plan.spec: stored(i) for i, plan in enumerate(plans)}
        return
    result = results[0]
    if args.output:
        shell.user_ns[args.output] = stored(0)
    if result is None:
        return
    if use_history:
        thread.record(turn_from(key, plans[0].user, result.produced, result.response, count))
    out = shell.user_ns.get("Out")
    if isinstance(out, dict) and isinstance(count, int):
        out[count] = result.response
    if fmt == "code" and final.code:
        try:
            shell.set_next_input(final.code, replace=False)
        except Exception:
            pass
