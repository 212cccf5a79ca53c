"""The tests' one wait: poll a condition until it holds, or fail saying what was awaited and what was last seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    context: Callable[[], object] | None = None,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value, and return that value. Once
    ``timeout`` seconds have passed without one, raise AssertionError naming ``what`` (phrased to follow "waiting
    until") and the last value seen, followed by ``context()`` when given (e.g. a log's tail). What ``predicate``
    raises goes through at once: it may assert that what it waits on is still alive."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout:g} s waiting until {what} (last value: {value!r})"
            raise AssertionError(message if context is None else f"{message}\n{context()}")
        time.sleep(interval)
