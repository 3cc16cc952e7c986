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

from .copilot_auth import CopilotAuth, token_rejected
from .copilot_token import (
    DEFAULT_COPILOT_API_URL,
    EDITOR_HEADERS,
    GITHUB_API_VERSION,
    CopilotToken,
    CopilotTokenManager,
    GitHubTokenProvider,
)
from .device_flow import (
    DeviceCode,
    DeviceCodeExpired,
    DeviceFlow,
    DeviceFlowDenied,
    DeviceFlowError,
    DeviceFlowState,
    DeviceFlowUnsupported,
    StateCallback,
    afetch_github_user,
    fetch_github_user,
)
from .endpoints import (
    COPILOT_CLIENT_ID,
    default_github_api_url,
    default_github_url,
    github_api_url_for,
)
from .login import LoginResult, device_login
from .token_store import (
    FoundToken,
    StoredToken,
    TokenStore,
    TokenStoreError,
    copilot_config_dir,
    default_token_path,
    dispatch_nb_home,
    find_github_token,
    mask_token,
)

__all__ = [
    "COPILOT_CLIENT_ID",
    "DEFAULT_COPILOT_API_URL",
    "EDITOR_HEADERS",
    "GITHUB_API_VERSION",
    "CopilotAuth",
    "CopilotToken",
    "CopilotTokenManager",
    "DeviceCode",
    "DeviceCodeExpired",
    "DeviceFlow",
    "DeviceFlowDenied",
    "DeviceFlowError",
    "DeviceFlowState",
    "DeviceFlowUnsupported",
    "FoundToken",
    "GitHubTokenProvider",
    "LoginResult",
    "StateCallback",
    "StoredToken",
    "TokenStore",
    "TokenStoreError",
    "afetch_github_user",
    "copilot_config_dir",
    "default_github_api_url",
    "default_github_url",
    "default_token_path",
    "device_login",
    "dispatch_nb_home",
    "fetch_github_user",
    "find_github_token",
    "github_api_url_for",
    "mask_token",
    "token_rejected",
]
