"""One ``%%chat`` execution, start to finish: a :class:`CellRun` and its steps (plan, run,
finish, record; ``docs/notebook.md``, "How a cell runs"). ``%%chat --each`` cells go to
``each.py`` instead. This module is imported on the first ``%%chat``, never by ``%load_ext``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from ..cache import CachedAdapter, CacheMissError
from ..cancel import CancelToken
from ..errors import DispatchError, ModelUnavailableError, RequestCancelled
from ..prompting import Prompt, PromptError, build_prompt
from ..render import model_label, name_spec
from ..types import ErrorEvent, Message, MessageDoneEvent, Response, RetryEvent, StreamDelta
from ..validation import replace_lone_surrogates, surrogate_note
from .display import (
    ChatError,
    ChatInterrupted,
    CompareEntry,
    FinalOutput,
    compare_output,
    explain_error,
    final_output,
)
from .each import run_each_cell, show_estimate
from .live import LiveView, detect_mode, has_kernel, make_view
from .login import ensure_copilot_login
from .options import (
    check_limits,
    check_output_name,
    resolve_context,
    resolve_schema,
    resolve_tools,
)
from .runner import Job, JobOutcome, run_jobs
from .state import KernelState
from .threads import ChatThread, Turn, cell_identity

if TYPE_CHECKING:
    from ..adapter import Adapter

__all__ = ["CallResult", "CellPlan", "CellRun", "make_work", "run_chat_cell"]


@dataclass
class CallResult:
    """A finished call: the last response and every message produced (for the thread)."""

    response: Response
    produced: list[Message]


def make_work(
    plan: CellPlan, adapter: Adapter
) -> Callable[[Callable[[Any], None], CancelToken], CallResult]:
    """The function a worker thread runs to ask ``adapter`` (one model of ``plan``)."""
    per_call = {"timeout": plan.timeout, "output": plan.schema}  # a session has the others

    def plain(emit: Callable[[Any], None], cancel: CancelToken) -> CallResult:
        messages = [*plan.history, plan.user]
        options: dict[str, Any] = {"system": plan.system, "cancel": cancel, **per_call,
                                   "max_tokens": plan.max_tokens, "temperature": plan.temperature}
        if plan.stream:
            stream = adapter.stream(messages, **options)
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
            # on_delta: only retries, as nothing streams
            response = adapter.chat(messages, stream=False, on_delta=emit, **options)
            for delta in response.deltas():  # what a streamed call would have produced
                emit(delta)
        assert response is not None
        return CallResult(response, [response.to_message()])

    def with_tools(emit: Callable[[Any], None], cancel: CancelToken) -> CallResult:
        from ..session import Session  # only for --tools
        from .approval import asking_through

        asking_through(emit, cancel)  # "ask" asks in this cell (this worker thread's context)

        session = Session(adapter, system=plan.system, tools=plan.tools,
                          max_tool_rounds=plan.max_tool_rounds, max_tokens=plan.max_tokens,
                          temperature=plan.temperature, approve=plan.approve)
        session.history = list(plan.history)
        start = len(session.history)
        last: Response | None = None
        extra: dict[str, Any] = {"cancel": cancel, **per_call}
        if not plan.stream:
            # --no-stream: the whole tool loop, then its exchange replayed from the collected turn
            last = session.send(plan.user.content, stream=False, **extra)
            assert session.last_turn is not None
            for collected in session.last_turn.events():
                emit(collected)
        else:
            for event in session.stream(plan.user.content, **extra):
                if isinstance(event, ErrorEvent):
                    raise event.error
                if isinstance(event, MessageDoneEvent):
                    last = event.response
                emit(event)
        if last is None:
            raise RequestCancelled("the session ended without an answer")
        return CallResult(last, list(session.history[start + 1 :]))

    return with_tools if plan.tools else plain


INTERRUPTED = "interrupted"


def _answer(outcome: JobOutcome) -> Response | None:
    """The answer a job ended with, else the partial answer its error kept."""
    if outcome.error is None:  # its result is a CallResult
        return outcome.result.response  # type: ignore[no-any-return]
    return outcome.error.partial if isinstance(outcome.error, DispatchError) else None


def _timing(outcome: JobOutcome) -> dict[str, float | None]:
    """``latency`` (None when the job never ended, or its model was never asked: a replay miss)
    and ``ttft`` (None without an event) of a job."""
    first = outcome.first_output
    asked = outcome.ended and not isinstance(outcome.error, CacheMissError)
    return {"latency": outcome.latency if asked else None,
            "ttft": None if first is None else first - outcome.started}


def _stored(outcome: JobOutcome, transcript: Any) -> Any:
    """What ``-o`` keeps of one model: the answer; on Ctrl-C what arrived (while a tool ran: the
    model's last answer, with its tool calls; else the error); on a failure the error (its
    ``.partial`` holds what arrived). An answer's footer names the model as the cell's did."""
    answer = _answer(outcome)
    if answer is None and transcript.rounds:  # abandoned while a tool ran: the model's last
        answer = transcript.rounds[-1]        # complete answer (its text and tool calls)
    if answer is not None:
        name_spec(answer, transcript.spec)
    if outcome.error is not None and not isinstance(outcome.error, RequestCancelled):
        return outcome.error
    return answer or outcome.error


def _clean(text: str, where: str, notes: list[str]) -> str:
    cleaned, count = replace_lone_surrogates(text)
    if count:
        notes.append(surrogate_note(count, where))
    return cleaned


@dataclass
class CellPlan:
    """What a ``%%chat`` cell will do, decided before anything is sent (:meth:`CellRun.plan`)."""

    #: the prompt as sent, and the notes shown above the answer
    prompt: Prompt
    #: the models (``-m a,b`` compares them) and an adapter for each
    specs: list[str]
    adapters: list[Adapter]
    #: ``-f``
    fmt: str
    #: the thread the turn goes into and the cell's turn key
    thread: ChatThread
    key: str
    #: False with ``--no-history``: no earlier turn sent, this one not recorded
    use_history: bool
    #: what every model is asked: the earlier turns sent, the prompt, and the call's options
    history: list[Message]
    user: Message
    system: str | None
    max_tokens: int | None
    temperature: float | None
    timeout: float | None
    stream: bool
    tools: list[Any]
    max_tool_rounds: int
    #: ``--schema``: the checked StructuredOutput (None: plain text)
    schema: Any = None
    #: ``--approve``: "auto" or "ask" (None: ask before MCP tools only)
    approve: str | None = None

    @property
    def compare(self) -> bool:
        """True when several models answer side by side."""
        return len(self.specs) > 1


@dataclass
class CellRun:
    """One ``%%chat`` execution: :meth:`execute` runs :meth:`plan`, :meth:`run`, :meth:`finish`,
    :meth:`record` and :meth:`raise_failure` in order; each step keeps what it produced on the
    object for the next one."""

    state: KernelState
    args: argparse.Namespace
    cell: str
    cell_plan: CellPlan | None = None
    view: LiveView | None = None
    outcomes: list[JobOutcome] = field(default_factory=list)
    interrupted: bool = False
    final: FinalOutput | None = None
    #: the default model's hint this cell shows above its answer ("": none)
    hint: str = ""

    def execute(self) -> None:
        """Plan, run, finish and record the cell; raise what went wrong last."""
        plan = self.plan()
        if self.args.estimate:
            self.show_estimates(plan)  # --estimate: nothing is sent
            return
        self.run()
        self.finish()
        self.record()
        self.raise_failure()

    def show_estimates(self, plan: CellPlan) -> None:
        """``--estimate``: what each model's call would cost (docs/cost.md); nothing is sent."""
        from ..estimates import estimate

        for spec, adapter in zip(plan.specs, plan.adapters, strict=True):
            show_estimate(estimate([*plan.history, plan.user], model=adapter,
                                   max_tokens=plan.max_tokens, system=plan.system), spec,
                          tools=bool(plan.tools))

    # -- 1. plan ---------------------------------------------------------------------------------
    def plan(self) -> CellPlan:
        """Check the options, build the prompt, pick the thread, get the adapters (a Copilot
        model may show the login first). Raises ``UsageError`` / :class:`ChatError` before
        anything is sent."""
        args, settings = self.args, self.state.settings
        prompt = self._prompt()
        check_limits(args)
        specs = self._models(prompt.notes)
        tools = resolve_tools(args.tools, self.namespace)
        if args.mcp:
            from .mcp_servers import resolve_servers  # only for --mcp

            tools += resolve_servers(args.mcp)
        tools += resolve_context(args.context, self.namespace)
        schema = self._schema()
        mode = self.state.cache_mode(args.cache)
        system = args.system if args.system is not None else (settings.system or None)
        if system is not None:
            system = _clean(system, "the system prompt", prompt.notes)
        thread, key = self._turn()
        use_history = not args.no_history
        self.cell_plan = CellPlan(
            prompt=prompt,
            specs=specs,
            adapters=self._adapters(specs, mode, tools=bool(tools)),
            fmt=args.format or settings.format,
            thread=thread,
            key=key,
            use_history=use_history,
            history=thread.history_for(key) if use_history else [],
            user=Message(role="user", content=prompt.text),
            system=system,
            max_tokens=args.max_tokens if args.max_tokens is not None else settings.max_tokens,
            temperature=args.temperature if args.temperature is not None else settings.temperature,
            timeout=settings.timeout,
            stream=settings.stream and not args.no_stream,
            tools=tools,
            max_tool_rounds=settings.max_tool_rounds,
            schema=schema,
            approve=args.approve,
        )
        return self.cell_plan

    @property
    def namespace(self) -> dict[str, Any]:
        """The user's namespace."""
        return self.state.shell.user_ns  # type: ignore[no-any-return]

    def _prompt(self) -> Prompt:
        """The cell's text with ``{expressions}`` filled in, without surrounding blank lines."""
        settings = self.state.settings
        try:
            prompt = build_prompt(self.cell, self.namespace,
                                  interpolate=settings.interpolate and not self.args.no_interpolate,
                                  max_chars=settings.max_value_chars, max_rows=settings.max_rows)
        except PromptError as exc:
            raise explain_error(exc) from None
        text = re.sub(r"\A(?:[ \t]*\n)+", "", prompt.text).rstrip()  # surrounding blank lines
        if not text:
            raise UsageError("the %%chat cell is empty: write the prompt below the %%chat line")
        prompt.text = _clean(text, "the prompt", prompt.notes)
        return prompt

    def _models(self, notes: list[str]) -> list[str]:
        """``-m``'s specs, else the default model (and its hint, added to ``notes``)."""
        try:
            mode: str | None = self.state.cache_mode(self.args.cache)
        except UsageError:  # said where the mode is used
            mode = None
        specs = self.state.model_specs(self.args.model, mode)
        changed = self.state.default_note()  # e.g. after %chat key openai: say it once
        hint = "" if self.args.model else self.state.default_model()[2]
        if hint == self.state.hint_shown:  # once a kernel (%chat status shows it any time)
            hint = ""
        self.hint = hint
        notes += [note for note in (changed, hint) if note]
        return specs

    def _schema(self) -> Any:
        """``--schema``'s StructuredOutput (None without it); a table cannot be ``-f code|text``."""
        schema = resolve_schema(self.args.schema, self.namespace)
        if schema is not None and self.args.format in ("code", "text"):
            raise UsageError(f"--schema shows the answer as a table: -f {self.args.format} does not apply")
        return schema

    def _turn(self) -> tuple[ChatThread, str]:
        """The thread (cleared by ``--new``) and this cell's turn key in it."""
        name = self.args.thread or self.state.settings.thread
        thread = self.state.threads.get(name)
        if self.args.new:
            thread.clear()
        identity = cell_identity(self.state.cell_id, self.state.execution_count)
        # numbered: a loop calling run_cell_magic in one execution keeps every answer
        occurrence = self.state.next_occurrence(f"{name}\n{identity}")
        return thread, f"{identity}#{occurrence}"

    def _adapters(self, specs: list[str], mode: str, tools: bool = False) -> list[Adapter]:
        """One adapter per model, labelled with the cell (``In[n]``) for the response cache;
        with ``tools``, one that cannot call them (the embedded model's format) is refused."""
        adapters: list[Adapter] = []
        for spec in specs:
            try:
                adapter = self.state.adapter(spec, mode, login=lambda: ensure_copilot_login(self.state))
            except (DispatchError, ImportError) as exc:
                raise explain_error(exc, spec=spec) from None
            if tools and getattr(adapter, "supports_tools", True) is False:
                raise UsageError(f"{spec} cannot call tools (--tools, --mcp, --context): its chat "
                                 "format does no function calling; choose another model with -m, "
                                 "e.g. -m openai:gpt-4.1 after %chat key openai")
            if isinstance(adapter, CachedAdapter):  # it names In[n] in what it records and misses
                adapter = adapter.with_label(self.state.label)
            adapters.append(adapter)
        return adapters

    # -- 2. run ----------------------------------------------------------------------------------
    def run(self) -> None:
        """Run every model's call with the live view; Ctrl-C sets :attr:`interrupted`."""
        plan, settings, shell = self._planned(), self.state.settings, self.state.shell
        jobs = [Job(name=spec, work=make_work(plan, adapter))
                for spec, adapter in zip(plan.specs, plan.adapters, strict=True)]
        view = self.view = make_view(detect_mode(shell, settings.live), plan.specs,
                                     rate=settings.update_rate, in_kernel=has_kernel(shell))
        view.start(plan.prompt.notes)
        if self.hint:  # shown now: not again under the next answers
            self.state.hint_shown = self.hint
        try:
            run_jobs(jobs, self._on_event, tick=view.tick, on_done=self._job_done,
                     on_interrupt=view.interrupt)
        except KeyboardInterrupt:
            self.interrupted = True
        except BaseException:
            view.close()
            raise
        self.outcomes = [job.outcome for job in jobs]

    def _on_event(self, index: int, event: Any) -> None:
        """A job's event: to the live view; an approval request is answered on this (the
        kernel's) thread."""
        if getattr(event, "type", None) == "approval_request":
            from .approval import answer_here

            view, plan = self._viewed(), self._planned()
            call_id = event.call.id
            if plan.compare:  # which model's call it is
                event.asked_by = plan.specs[index]
            try:
                answer_here(event, asking=lambda: view.approval_asked(index, call_id))
            finally:  # Ctrl-C too: a click that came first still counts
                view.approval_answered(index, call_id, event.answer)
        else:
            self._viewed().feed(index, event)

    def _job_done(self, index: int, outcome: JobOutcome) -> None:
        """A model finished: complete its transcript and show its footer."""
        view = self._viewed()
        transcript = view.transcripts[index]
        # every call answered from the response cache: the answer has no real latency
        adapter = self._planned().adapters[index]
        transcript.replayed = (outcome.error is None and isinstance(adapter, CachedAdapter)
                               and adapter.replayed_calls > 0 and adapter.model_calls == 0)
        transcript.finish(_answer(outcome))
        error = None
        if outcome.error is not None:
            error = "⏹ " + INTERRUPTED if isinstance(outcome.error, RequestCancelled) \
                else "⚠ " + str(outcome.error)
        view.job_done(index, transcript.footer(_timing(outcome)["latency"]), error)

    # -- 3. finish -------------------------------------------------------------------------------
    def finish(self) -> FinalOutput:
        """Replace the live view with the cell's one static output."""
        plan, view = self._planned(), self._viewed()
        self.final = final = self._compare_output() if plan.compare else self._answer_output()
        view.finish(final)
        return final

    @property
    def context(self) -> dict[str, Any]:
        """What the cell sent besides the prompt, for error advice (``explain_error``)."""
        plan = self._planned()
        turns = len(plan.thread) if plan.use_history else 0
        failed = plan.thread.failed_before(plan.key) if plan.use_history else []
        return {"history_turns": turns, "no_history": self.args.no_history, "failed_cells": failed}

    def _extra(self) -> dict[str, Any]:
        """The footer's metadata: the thread (not for a comparison or --no-history), the view."""
        plan = self._planned()
        thread = None if (plan.compare or not plan.use_history) else plan.thread.name
        return {"thread": thread, "live": self._viewed().mode}

    def _notes(self) -> list[str]:
        """The prompt's notes plus the warnings logged while the answers streamed."""
        out = list(self._planned().prompt.notes)
        for transcript in self._viewed().transcripts:
            out += [n for n in transcript.log_notes if n not in out]
        return out

    def _compare_output(self) -> FinalOutput:
        plan, view = self._planned(), self._viewed()
        entries = []
        for spec, transcript, outcome in zip(plan.specs, view.transcripts, self.outcomes, strict=True):
            error = None
            stopped = isinstance(outcome.error, RequestCancelled)
            if outcome.error is not None:
                error = INTERRUPTED if stopped else \
                    explain_error(outcome.error, spec=spec, context=self.context).message
            entries.append(CompareEntry(spec=spec, transcript=transcript, error=error,
                                        interrupted=stopped, **_timing(outcome)))
        parsed = [_answer(o) if o.error is None else None for o in self.outcomes]
        return compare_output(entries, extra=self._extra(), notes=self._notes(),
                              parsed=None if plan.schema is None else parsed)

    def _answer_output(self) -> FinalOutput:
        plan, outcome, extra = self._planned(), self.outcomes[0], self._extra()
        parsed = None  # --schema: the structured answer as a table (not when interrupted)
        if plan.schema is not None and not self.interrupted and outcome.error is None:
            parsed = _answer(outcome)
            extra["schema"] = self.args.schema.strip()
        note = None
        if self.interrupted or isinstance(outcome.error, RequestCancelled):
            note = "⏹ " + INTERRUPTED
        elif outcome.error is not None:
            note = f"⚠ {type(outcome.error).__name__}"
        return final_output(self._viewed().transcripts[0], fmt=plan.fmt, extra=extra, note=note,
                            notes=self._notes(), failed=self.interrupted or outcome.error is not None,
                            parsed=parsed, **_timing(outcome))

    # -- 4. record -------------------------------------------------------------------------------
    def record(self) -> None:
        """Record the turn, store ``-o VAR`` (``-o`` always stores something: ``docs/notebook.md``,
        "Formats") and ``Out[n]``, send ``-f code`` to the next cell."""
        plan, view = self._planned(), self._viewed()
        namespace, output = self.namespace, self.args.output
        stored = {spec: _stored(outcome, transcript) for spec, outcome, transcript
                  in zip(plan.specs, self.outcomes, view.transcripts, strict=True)}
        if output:
            namespace[output] = stored if plan.compare else stored[plan.specs[0]]
        if plan.compare:
            return
        outcome = self.outcomes[0]
        if outcome.error is not None:
            if plan.use_history:  # its turn is missing: a later cell's miss names it
                plan.thread.failed[plan.key] = self.state.label
            return
        result: CallResult = outcome.result
        count = self.state.execution_count
        if plan.use_history:
            produced = result.produced or [result.response.to_message()]
            plan.thread.record(Turn(plan.key, [plan.user, *produced],
                                    model_label(plan.specs[0], result.response.model),
                                    execution_count=count))
        out = namespace.get("Out")
        if isinstance(out, dict) and isinstance(count, int):
            out[count] = result.response
        if plan.fmt == "code" and self.final is not None and self.final.code:
            with contextlib.suppress(Exception):
                self.state.shell.set_next_input(self.final.code, replace=False)

    def raise_failure(self) -> None:
        """Raise what went wrong, after the output is shown: :class:`ChatInterrupted` on Ctrl-C,
        the one model's error as a short :class:`ChatError`, or in a comparison the first error
        when every model failed."""
        plan = self._planned()
        if self.interrupted:
            raise ChatInterrupted(self._interrupted_message()) from None
        failure, failed_spec = self.outcomes[0].error, plan.specs[0]
        if failure is None or any(o.error is None for o in self.outcomes):  # some model answered
            return
        if plan.compare:
            raise explain_error(failure, spec=failed_spec, context=self.context) from None
        if isinstance(failure, RequestCancelled):
            raise ChatInterrupted(self._interrupted_message()) from None
        if not isinstance(failure, (DispatchError, ChatError)):
            raise failure
        # only a model the provider does not offer is explained by its model list
        available = None
        if isinstance(failure, ModelUnavailableError):
            available = []
            with contextlib.suppress(Exception):
                available = [m.id for m in plan.adapters[0].list_models()]
        raise explain_error(failure, spec=failed_spec, available=available, context=self.context) from None

    def _interrupted_message(self) -> str:
        transcripts = self._viewed().transcripts
        if any(t.has_text for t in transcripts):
            return INTERRUPTED + "; the partial answer is kept above"
        if any(not t.empty for t in transcripts):  # thinking or tool calls, no answer yet
            return INTERRUPTED + "; what arrived is kept above"
        return INTERRUPTED

    # -- the steps' order ------------------------------------------------------------------------
    def _planned(self) -> CellPlan:
        if self.cell_plan is None:
            raise RuntimeError("CellRun.plan() has not run")
        return self.cell_plan

    def _viewed(self) -> LiveView:
        if self.view is None:
            raise RuntimeError("CellRun.run() has not run")
        return self.view


def run_chat_cell(state: KernelState, args: argparse.Namespace, cell: str) -> None:
    """Run one ``%%chat`` cell: a ``--each`` cell (``each.py``) or a :class:`CellRun`."""
    check_output_name(args.output)
    if args.each is not None:
        run_each_cell(state, args, cell)
        return
    each_only = [name for name, given in (
        ("--budget", args.budget is not None), ("--limit", args.limit is not None),
        ("--yes", args.yes), ("--deferred", args.deferred),
        ("--checkpoint", args.checkpoint is not None)) if given]
    if each_only:
        budget = ("; a budget for a conversation: Session(budget=...)"
                  if "--budget" in each_only else "")
        raise UsageError(f"{', '.join(each_only)} appl{'ies' if len(each_only) == 1 else 'y'} "
                         f"to --each cells (one prompt over many rows: %%chat --each df "
                         f"{each_only[0]} ...){budget}")
    CellRun(state, args, cell).execute()
