"""Kernel managers for the tests' real kernels: ipc sockets in a private folder, no TCP ports.

jupyter_client gives a kernel its five TCP ports by binding port 0 and letting each go; the kernel
binds them a second later, when it has started. In between, another test process (a loopback fake,
a client's outgoing connection) can take one, and the kernel dies with ``ZMQError: Address already
in use`` (seen once in 14 runs of the suite on three processes). ipc sockets are files named after
a fresh random path in a folder of this process's own: nothing else can take them.

Used by every test that starts a kernel itself (``NotebookClient(kernel_manager_class=...)``, the
``KernelManager`` of test_kernel.py and test_mcp_kernel.py, nbval's kernels through
notebooks/conftest.py) and by notebooks_support.py run as a script (only jupyter_client and the
standard library are imported). The Jupyter servers of the browser tests need none of this: their
kernel restarter picks new ports for a kernel that died before it was ready.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from typing import Any

from jupyter_client.manager import AsyncKernelManager, KernelManager
from traitlets import CaselessStrEnum, HasTraits, default

_FOLDER: str | None = None


def _endpoint() -> str:
    """A fresh path prefix for one kernel's sockets (``<prefix>-1`` … ``<prefix>-5``), short enough
    for a Unix socket's 107-byte limit."""
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = tempfile.mkdtemp(prefix="dnb-kernels-")
        atexit.register(shutil.rmtree, _FOLDER, True)
    return os.path.join(_FOLDER, uuid.uuid4().hex[:12])


class _IPC(HasTraits):
    """What makes a kernel manager's kernel listen on ipc sockets of its own."""

    transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

    @default("ip")
    def _ip_default(self) -> str:
        return _endpoint()


class IPCKernelManager(_IPC, KernelManager):
    """A ``KernelManager`` on ipc sockets."""


class AsyncIPCKernelManager(_IPC, AsyncKernelManager):
    """The same for nbclient, whose kernel manager is the asynchronous one."""


def notebook_client(nb: Any, **kwargs: Any) -> Any:
    """``nbclient.NotebookClient`` on an ipc kernel (``kernel_name="python3"`` unless given)."""
    from nbclient import NotebookClient

    kwargs.setdefault("kernel_name", "python3")
    return NotebookClient(nb, kernel_manager_class=AsyncIPCKernelManager, **kwargs)
