"""The built-in providers, one module each, registered by :mod:`dispatch_nb.registry`'s descriptors.

Importing any of them loads the registry too: its descriptors give :mod:`dispatch_nb.cost` each
provider's ``genai-prices`` id, so an adapter built directly (``OpenAIAdapter(...)``) is priced
like one from ``connect()``.
"""

from .. import registry as _registry  # noqa: F401
