"""The GitHub device login in a notebook: ``%chat login``, and any ``%%chat`` that needs one
(``docs/notebook.md``, "The device-login view"). :func:`~dispatch_nb.auth.login.device_login` polls
on a worker thread; its code and state changes reach the view on the kernel's thread.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DispatchError, RequestCancelled
from .display import ChatError, ChatInterrupted
from .live import close_widgets, detect_mode, has_kernel, ipy_display
from .runner import Job, run_jobs
from .state import KernelState

if TYPE_CHECKING:
    from ..auth.device_flow import DeviceCode

__all__ = ["LoginOutcome", "LoginView", "ensure_copilot_login", "run_login"]

TITLE = "Sign in to GitHub Copilot"
_DIM = "color: var(--jp-ui-font-color2, #777); font-size: 0.9em;"


@dataclass
class LoginOutcome:
    """How a login ended: ``state`` is approved / denied / expired / cancelled / error."""

    state: str
    user: str | None = None
    path: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when the user approved and the token is saved."""
        return self.state == "approved"


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


_STATUS = {
    "pending": "⏳ Waiting for you to approve on GitHub…",
    "approved": "✅ Approved",
    "denied": "❌ The request was denied on GitHub.",
    "expired": "⌛ The code expired before it was approved.",
    "cancelled": "⏹ Login interrupted.",
}


def _status_text(state: str, info: Mapping[str, Any]) -> str:
    if state == "slow_down":
        return f"⏳ Waiting… (GitHub asked to check less often: every {info.get('interval', 0):.0f} s)"
    return _STATUS.get(state) or f"⚠ {info.get('message') or state}"


def _ending(outcome: LoginOutcome) -> str:
    """What a login that did not succeed says (and how to try again)."""
    retry = " Run `%chat login` for a new code." if outcome.state != "cancelled" else ""
    return (outcome.message or _status_text(outcome.state, {})) + retry


class LoginView:
    """What a login shows, the same in the three renderings (each draws it in :meth:`_show`);
    every method runs on the kernel's thread."""

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason
        self.code: DeviceCode | None = None
        self.state = "starting"
        #: the status line, and the seconds the code had left when last shown
        self.message = "Asking GitHub for a code…"
        self.seconds_left: float | None = None

    def show_code(self, code: DeviceCode) -> None:
        """A new user code to show."""
        self.code = code
        self.state = "pending"
        self.message = _status_text("pending", {})
        self.seconds_left = code.seconds_left()
        self._show()

    def set_state(self, state: str, info: Mapping[str, Any]) -> None:
        """The flow's state changed."""
        self.state = state
        self.message = _status_text(state, info)
        self._show()

    def countdown(self, seconds_left: float) -> None:
        """About once a second while waiting (a change of the second is shown)."""
        if self.seconds_left is None or int(seconds_left) != int(self.seconds_left):
            self.seconds_left = seconds_left
            self._show()

    def _show(self) -> None:
        """Draw the code, the countdown and the status line."""

    def done(self, outcome: LoginOutcome) -> None:
        """Show how the login ended."""

    def end(self, outcome: LoginOutcome) -> None:
        """The login ended: its state is ``outcome``'s, shown by :meth:`done`."""
        self.state = outcome.state
        self.done(outcome)


# -- widget -------------------------------------------------------------------------------------


class WidgetLoginView(LoginView):
    """ipywidgets rendering with a copy button; replaced by one static line when it ends."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason)
        import ipywidgets as widgets
        intro = f"<b>{TITLE}</b>" + (
            f"<div style='{_DIM}'>{html.escape(reason)}</div>" if reason else ""
        )
        self.title = widgets.HTML(value=intro)
        self.code_html = widgets.HTML(value="<i>Asking GitHub for a code…</i>")
        self.link = widgets.HTML(value="")
        self.clock = widgets.HTML(value="")
        self.status = widgets.HTML(value="")
        self.box = widgets.VBox(
            [self.title, self.code_html, self.link, self.clock, self.status],
            layout={"border": "1px solid var(--jp-border-color1, #ccc)", "padding": "8px 12px",
                    "width": "fit-content"},
        )
        self.handle = ipy_display(self.box, display_id=True)

    def _show(self) -> None:  # (setting a widget's value to what it holds sends nothing)
        self.status.value = html.escape(self.message)
        code = self.code
        if code is None:
            return
        user_code = html.escape(code.user_code)
        js_code = code.user_code.replace("\\", "\\\\").replace("'", "\\'")
        self.code_html.value = (
            "<div style='display:flex; align-items:center; gap:12px; margin:6px 0'>"
            "<span style='font-size:2.2em; font-weight:bold; letter-spacing:0.12em; "
            "font-family: var(--jp-code-font-family, monospace); user-select:all; "
            "padding:2px 12px; border:1px solid var(--jp-border-color1, #ccc); border-radius:6px'>"
            f"{user_code}</span>"
            "<button style='padding:4px 10px; cursor:pointer' title='Copy the code' "
            f"onclick=\"navigator.clipboard.writeText('{html.escape(js_code)}')"
            ".then(() => {{ this.textContent = 'Copied ✓'; }})\">Copy</button></div>"
        )
        uri = html.escape(code.verification_uri)
        self.link.value = (
            f"Open <a href='{uri}' target='_blank' rel='noopener'><b>{uri}</b></a> "
            "and enter the code."
        )
        clock = _clock(self.seconds_left or 0)
        self.clock.value = f"<span style='{_DIM}'>The code expires in {clock}.</span>"

    def done(self, outcome: LoginOutcome) -> None:
        # Whatever the end, leave one static line and no widget state in the saved notebook.
        self.handle.update(_static_bundle(outcome), raw=True)
        close_widgets((self.title, self.code_html, self.link, self.clock, self.status, self.box))


def _static_bundle(outcome: LoginOutcome) -> dict[str, str]:
    """The one static output a finished login leaves: who logged in, or what went wrong."""
    if outcome.ok:
        who = f" as **@{outcome.user}**" if outcome.user else ""
        where = f" The token is saved in `{outcome.path}`." if outcome.path else ""
        md = f"✅ Logged in to GitHub Copilot{who}.{where}"
    else:
        md = f"**{TITLE}**: {_ending(outcome)}"
    return {"text/markdown": md, "text/plain": md.replace("**", "").replace("`", "")}


# -- display ------------------------------------------------------------------------------------


class DisplayLoginView(LoginView):
    """One Markdown output updated in place (kernels without ipywidgets)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason)
        self.handle = ipy_display(self._bundle(), raw=True, display_id=True)

    def _bundle(self) -> dict[str, str]:
        lines = [f"**{TITLE}**"]
        if self.reason:
            lines.append(f"<sub>{html.escape(self.reason)}</sub>")
        if self.code is not None:
            lines.append(
                f"Open [{self.code.verification_uri}]({self.code.verification_uri}) and enter "
                f"the code:\n\n## `{self.code.user_code}`"
            )
            if self.seconds_left is not None:
                lines.append(f"<sub>The code expires in {_clock(self.seconds_left)}.</sub>")
        lines.append(self.message)
        md = "\n\n".join(lines)
        return {"text/markdown": md, "text/plain": md.replace("**", "").replace("`", "")}

    def _show(self) -> None:
        self.handle.update(self._bundle(), raw=True)

    def done(self, outcome: LoginOutcome) -> None:
        if outcome.ok:
            self.handle.update(_static_bundle(outcome), raw=True)
            return
        self.seconds_left = None
        self.message = _ending(outcome)
        self._show()


# -- text ---------------------------------------------------------------------------------------


class TextLoginView(LoginView):
    """Printed lines (terminal IPython)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason)
        print(TITLE + (f" — {reason}" if reason else ""), flush=True)

    def show_code(self, code: DeviceCode) -> None:
        super().show_code(code)
        print(
            f"Open {code.verification_uri} and enter the code:\n\n    {code.user_code}\n\n"
            f"The code expires in {_clock(code.seconds_left())}. Waiting for approval "
            "(interrupt to cancel)…",
            flush=True,
        )

    def set_state(self, state: str, info: Mapping[str, Any]) -> None:
        # "approved" is said once, by done() (with who logged in and where the token is); the
        # other endings too: only a slow-down is worth a line of its own.
        if state != self.state and state == "slow_down":
            print(_status_text(state, info), flush=True)
        super().set_state(state, info)

    def done(self, outcome: LoginOutcome) -> None:
        if outcome.ok:
            print(_static_bundle(outcome)["text/plain"], flush=True)
        else:
            print(outcome.message or _status_text(outcome.state, {}), flush=True)


# -- the flow -----------------------------------------------------------------------------------


def ensure_copilot_login(state: KernelState) -> None:
    """Show the device login when no GitHub token is available; raise ChatError if it fails."""
    from ..auth.token_store import find_github_token

    if find_github_token() is not None:
        return
    run_login(state, reason="This cell uses GitHub Copilot, which needs a GitHub login.")


def run_login(state: KernelState, *, reason: str | None = None) -> LoginOutcome:
    """Run the device login with a live view; return on approval, else raise a short
    :class:`ChatError` (denied, expired, GitHub unreachable) or :class:`ChatInterrupted`."""
    # the auth package is imported by a login only, not by every first %%chat
    from ..auth.device_flow import DeviceCodeExpired, DeviceFlow, DeviceFlowDenied
    from ..auth.login import device_login

    views: dict[str, type[LoginView]] = {"widget": WidgetLoginView, "display": DisplayLoginView}
    text = DisplayLoginView if has_kernel(state.shell) else TextLoginView  # a kernel: its output
    view = views.get(detect_mode(state.shell, state.settings.live), text)(reason)
    state.login_view = view
    flow = DeviceFlow(min_interval=state.settings.login_min_interval)

    def work(emit: Any, cancel: Any) -> LoginOutcome:
        # the one login routine; its callbacks come back to the kernel's thread as events
        result = device_login(
            flow,
            on_code=lambda code: emit(("code", code)),
            on_state=lambda state, info: emit((str(state), dict(info))),
            cancel=cancel,
        )
        return LoginOutcome("approved", user=result.user, path=str(result.path))

    def on_event(_index: int, event: Any) -> None:
        if not isinstance(event, tuple):
            return
        if event[0] == "code":
            view.show_code(event[1])
        else:
            view.set_state(*event)

    def tick() -> float:  # the countdown (a view shows only a change of the second)
        if view.code is not None:
            view.countdown(view.code.seconds_left())
        return 1.0

    job = Job(name="login", work=work)

    try:
        run_jobs([job], on_event, tick=tick)
    except KeyboardInterrupt:
        view.end(LoginOutcome("cancelled", message=_STATUS["cancelled"]))
        raise ChatInterrupted("login interrupted") from None
    error = job.outcome.error
    if error is None:
        outcome: LoginOutcome = job.outcome.result
        view.end(outcome)
        state.close_adapters()
        return outcome
    endings = ((DeviceFlowDenied, "denied"), (DeviceCodeExpired, "expired"), (RequestCancelled, "cancelled"))
    ending = next((name for kind, name in endings if isinstance(error, kind)), "error")
    if ending == "error" and view.code is None and isinstance(error, DispatchError):
        # no code yet: GitHub could not be asked for one
        view.end(LoginOutcome("error", message=f"⚠ {error.message}"))
        raise ChatError("Login failed", error.message, "Check DISPATCH_NB_GITHUB_URL and the network.",
                        original=error) from None
    outcome = LoginOutcome(ending, message=_STATUS.get(ending) or f"⚠ {error}")
    view.end(outcome)
    if ending == "cancelled":
        raise ChatInterrupted("login interrupted") from None
    raise ChatError("Login " + ending, outcome.message.lstrip("⚠❌⌛ "), "Run `%chat login` again.",
                    original=error) from None
