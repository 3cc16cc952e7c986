"""``budget=`` in a batch: the engine asks :class:`RowBudget` before each attempt of a row and
tells it how the attempt ended (the accounting itself is :class:`dispatch_nb.cost.Budget`)."""

from __future__ import annotations

from decimal import Decimal

from ..adapter import Adapter
from ..budget import Budget
from ..cancel import CancelToken
from ..cost import attempt_cost
from ..estimates import worst_case
from ..types import Message, Response, as_messages
from .rows import RowCall

__all__ = ["RowBudget"]


class RowBudget:
    """One batch's budget over its rows: each attempt of a row reserves the row's worst case
    and settles at what it cost; a row with Python tools leaves that to its
    :class:`~dispatch_nb.session.Session`, given the same :class:`Budget` (docs/cost.md)."""

    def __init__(self, budget: Budget, adapter: Adapter, call: RowCall) -> None:
        self.budget = budget
        self.adapter = adapter
        self.call = call

    def worst(self, messages: str | list[Message], *, batch: bool = False) -> Decimal:
        """The most one attempt of this row can cost (``batch``: answered through the
        provider's batch API, at its batch price; ``ValueError`` when the price is unknown)."""
        calls, retries = 1, self.call.options.get("output_retries")
        if self.call.options.get("output") is not None:  # with its retries (output_retries=)
            calls += 1 if retries is None else int(retries)
        one = worst_case(self.adapter, as_messages(messages), system=self.call.system,
                         tools=self.call.tools, max_tokens=self.call.options.get("max_tokens"),
                         output=self.call.options.get("output"), batch=batch)
        return one if batch else one * calls  # a deferred row is asked once

    async def reserve(self, messages: str | list[Message], cancel: CancelToken) -> Decimal:
        """Reserve the row's worst case, waiting while rows in flight may free some; raises
        :class:`~dispatch_nb.errors.BudgetExceededError` (the row is not sent)."""
        if self.call.runs_tools:
            return Decimal(0)  # the row's Session reserves before each of its calls
        return await self.budget.areserve(self.worst(messages), cancel)

    def settle(self, reserved: Decimal, response: Response | None, *, failed: bool) -> None:
        """The attempt that reserved ``reserved`` ended (``response``: the answer, or the
        partial answer of a failed attempt)."""
        if self.call.runs_tools:
            return
        self.budget.settle(reserved, attempt_cost(response, failed, reserved))
