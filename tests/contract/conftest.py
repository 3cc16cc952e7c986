"""The fixtures every contract test shares: a target, its running fake, adapters pointed at it.

A test that asks for any of these runs once per :class:`~tests.contract.targets.Target` in
``targets.TARGETS`` (the parametrization id is the target's name):

- ``target``: the :class:`Target` (skipped, with its reason, where it cannot run here);
- ``fake``: its wire-protocol fake, serving on a loopback port for the test, closed after it;
- ``make``: ``make(**kw)`` builds an adapter pointed at ``fake`` (``max_retries=0`` unless given);
  every adapter it built is closed after the test;
- ``adapter``: one adapter from ``make()``.

A module that runs another list of targets overrides ``target`` with
``target = target_fixture(ITS_TARGETS)``; one that wants a variant of each fake overrides ``fake``
and asks for this one (``def fake(fake, request)``: see ``test_contract.py``, which runs every case
plain and gzip-compressed). To run a test for some targets only, ``@only([...])`` (``targets.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dispatch_nb.adapter import Adapter

from ..fakes.provider import ProviderFake
from .targets import TARGETS, Target, target_fixture

target = target_fixture(TARGETS)


@pytest.fixture
def fake(target: Target) -> Iterator[ProviderFake]:
    with target.make_fake() as f:
        yield f


@pytest.fixture
def make(target: Target, fake: ProviderFake) -> Iterator[Callable[..., Adapter]]:
    made: list[Adapter] = []

    def build(**kw: Any) -> Adapter:
        kw.setdefault("max_retries", 0)
        adapter = target.make_adapter(fake, **kw)
        made.append(adapter)
        return adapter

    yield build
    for adapter in made:
        adapter.close()


@pytest.fixture
def adapter(make: Callable[..., Adapter]) -> Adapter:
    return make()
