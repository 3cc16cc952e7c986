"""Prompts over data: one template, many rows — concurrent, resumable, with progress, on Dask.

::

    from dispatch_nb import batch

    result = batch("Is this review positive or negative? {review}", reviews_df,
                   model="openai:gpt-4.1-mini", concurrency=32, checkpoint="reviews.jsonl")
    result[0].text          # row 0's Response (or the DispatchError it ended with)
    result.to_pandas()      # the DataFrame with answer / error / tokens / latency columns added

The package, one idea per module:

* ``rows.py``       — reading the input lazily, filling the template, each row's key
* ``limiter.py``    — adaptive concurrency (AIMD: a 429 halves it, successes grow it back)
* ``engine.py``     — running rows on one event loop: retries, deadlines, cancellation, and the
  stop at an error every row would get
* ``checkpoint.py`` — the response cache, keyed by row, that a rerun resumes from
* ``progress.py``   — the tqdm bar (widget in Jupyter, text in a terminal)
* ``result.py``     — :class:`BatchResult` (ok / failed / not sent), :class:`BatchInterrupted`
* ``plan.py``       — the plan, the adapter rows go through, the final accounting (shared by the
  local run and the Dask run)
* ``run.py``        — :func:`batch` and :func:`abatch`, their arguments checked
* ``cluster.py``    — the same rows on a Dask cluster (``executor=``)
* ``deferred.py``   — the same rows as provider batch jobs (``deferred=True``)

The guide: docs/batch.md.
"""

from __future__ import annotations

from .deferred import BatchJob, BatchPendingError
from .result import BatchInterrupted, BatchResult
from .run import abatch, batch

__all__ = ["BatchInterrupted", "BatchJob", "BatchPendingError", "BatchResult", "abatch", "batch"]
