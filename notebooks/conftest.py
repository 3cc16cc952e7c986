"""The example notebooks run under nbval (``--nbval-lax`` in pyproject's ``addopts``): each cell
must run without error. They replay their recorded answers (each notebook's first code cell makes
``replay`` the default cache mode), so no model, account or network is needed; they do start a real
Jupyter kernel, hence the ``kernel`` marker (``make test-fast`` leaves them out)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every notebook cell ``kernel``."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.kernel)
