"""Who sent the code running now: a front end a person works in (JupyterLab, Notebook 7, VS Code,
Colab), or a client nobody watches (nbclient — ``jupyter execute``, papermill, nbval — or voilà),
where nothing can be clicked or typed.

The signal is ``allow_stdin`` of the ``execute_request`` (Jupyter messaging protocol): front ends
that can answer ``input()`` send ``true``; nbclient and voilà send ``false``. ipykernel hands out
the request being run with ``Kernel.get_parent("shell")`` (on worker threads too).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["allow_stdin", "current_shell", "unattended"]


def current_shell() -> Any:
    """The running IPython shell when this process is a Jupyter kernel (ipykernel), else None."""
    if "ipykernel" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if getattr(shell, "kernel", None) is not None else None


def allow_stdin(shell: Any = None) -> bool | None:
    """``allow_stdin`` of the ``execute_request`` the kernel is running now (``shell``: the running
    one by default); None when there is no kernel, or what it handles now is not an execute
    request (a ``comm_msg``: someone clicked a widget) or it does not say."""
    shell = shell if shell is not None else current_shell()
    get_parent = getattr(getattr(shell, "kernel", None), "get_parent", None)
    if get_parent is None:
        return None
    try:
        parent = get_parent("shell")
    except Exception:
        return None
    if not isinstance(parent, dict) or parent.get("header", {}).get("msg_type") != "execute_request":
        return None
    content = parent.get("content", {})
    return bool(content["allow_stdin"]) if "allow_stdin" in content else None


def unattended(shell: Any = None) -> bool:
    """True when the cell running now was sent by a client nobody watches (``allow_stdin:
    false``: nbclient, papermill, voilà); False in an interactive front end, in terminal IPython,
    and when the kernel cannot say."""
    return allow_stdin(shell) is False
