"""Waiting in tests: on a condition, with a bound that holds on a busy machine.

A test waits for something to become true (an index entry, a health flag, a series on
/metrics), never for an amount of wall-clock time to pass. The bound only says when to
give up on a condition that will never hold: it is generous (``PATIENCE``), because a
passing test never waits it out, and a loaded 2-core CI machine can take many times
longer than an idle laptop for the same work.

Where the product promises a time bound (e.g. `PodWatcher.outage_bound`), derive the
wait from that promise with `within` rather than writing a few seconds into the test.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

# Seconds to give any condition before the test fails. Generous on purpose (see above).
PATIENCE = 60.0


def wait_until(predicate: Callable[[], T], timeout: float = PATIENCE, what: str = "the condition",
               interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Exceptions from ``predicate`` propagate (a broken check should fail loudly).

    Raises:
        AssertionError: ``predicate`` stayed falsy for ``timeout`` seconds; the message
            names ``what`` was awaited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not hold within {timeout:g}s")
        time.sleep(interval)


def within(bound: float, factor: float = 4.0, slack: float = 10.0) -> float:
    """A generous wait for something the product promises within ``bound`` seconds.

    ``factor`` times the bound plus ``slack`` seconds: room for a loaded machine, yet
    still far below what a product that broke its promise by an order of magnitude takes
    when the bound is large, and finite when it never keeps it.
    """
    return bound * factor + slack


class FakeClock:
    """A clock a test moves by hand (``clock.now += 30``), for parts that take ``clock=``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
