"""Prompts over data: one template, many rows — live, on Dask, or as provider batch jobs.

:func:`batch` / :func:`abatch` return a :class:`BatchResult`. The guide, and which module of this
package does what: docs/batch.md.
"""

from __future__ import annotations

from .deferred import BatchJob, BatchPendingError
from .result import BatchInterrupted, BatchResult
from .run import abatch, batch

__all__ = ["BatchInterrupted", "BatchJob", "BatchPendingError", "BatchResult", "abatch", "batch"]
