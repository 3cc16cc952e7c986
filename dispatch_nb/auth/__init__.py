"""Authentication for GitHub Copilot: device-flow login, the token file, the Copilot token.

::

    DeviceFlow            GitHub OAuth device flow (RFC 8628) → a GitHub token
    device_login()        the whole login (start, poll, who, save) with callbacks, for every UI
    TokenStore            our GitHub token file (0600), find_github_token() resolves which to use
    CopilotTokenManager   GitHub token → short-lived Copilot token, cached, single-flight refresh
    CopilotAuth           httpx.Auth: the Copilot token on each request; after a 401, one refresh + resend

Nothing here imports IPython or prints: the terminal (``python -m dispatch_nb login``) and the
notebook widget both drive these objects.
"""

from __future__ import annotations

# each module's public names are the package's (as asyncio's __init__ does it)
from . import copilot_auth, copilot_token, device_flow, endpoints, login, token_store
from .copilot_auth import *  # noqa: F403
from .copilot_token import *  # noqa: F403
from .device_flow import *  # noqa: F403
from .endpoints import *  # noqa: F403
from .login import *  # noqa: F403
from .token_store import *  # noqa: F403

__all__ = [
    *copilot_auth.__all__, *copilot_token.__all__, *device_flow.__all__, *endpoints.__all__,
    *login.__all__, *token_store.__all__,
]
