"""The pipeline's one retry mechanism: what is stopped by an error is tried again after a delay that doubles with
each failure, from :data:`RETRY_FIRST` up to :data:`RETRY_MOST` seconds (DESIGN §6: a failure stops only itself).

It serves a target stopped by an error, a table stopped alone at a target, a target ``run`` loads beside the others,
and a table ``run`` loads again at one target. :class:`Backoffs` is safe across threads: ``run``'s loads record
their failures in their own threads while the applier's loop reads them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

RETRY_FIRST, RETRY_MOST = 2.0, 60.0  # seconds before what failed is tried again, doubling


def next_delay(before: float | None, first: float = RETRY_FIRST, most: float = RETRY_MOST) -> float:
    """The delay after a failure, the one before being ``before`` (None or 0: none before it)."""
    return first if not before else min(before * 2, most)


@dataclass
class Stop:
    """Stopped by ``error``: tried again at ``retry_at`` (``time.monotonic()``; 0: at once), after ``delay``."""

    retry_at: float
    delay: float
    error: Exception
    trying: bool = False  # tried again now (said once)

    def due(self, now: float, retry: bool = True) -> bool:
        """Is it to be tried now (``retry`` False: only one stopped before this process, at ``retry_at`` 0)?"""
        return (retry or self.retry_at == 0.0) and now >= self.retry_at


class Backoffs(Generic[K]):
    """What is stopped now, by key (a target's name, (target, table), ...), each with its :class:`Stop`. Every
    method takes the lock; what it returns is a copy or a :class:`Stop` its caller may read."""

    def __init__(self, first: float = RETRY_FIRST, most: float = RETRY_MOST) -> None:
        self.first, self.most = first, most
        self._stops: dict[K, Stop] = {}
        self._lock = threading.Lock()

    def fail(self, key: K, error: Exception, now: float | None = None) -> Stop:
        """``key`` failed (again) with ``error``: stopped until its next delay has passed."""
        now = time.monotonic() if now is None else now
        with self._lock:
            before = self._stops.get(key)
            delay = next_delay(before.delay if before is not None else None, self.first, self.most)
            stop = self._stops[key] = Stop(now + delay, delay, error)
            return stop

    def stopped(self, key: K, error: Exception) -> Stop:
        """``key`` is stopped by ``error`` from before this process: tried once at once, and its delay starts
        (nothing if it is known already)."""
        with self._lock:
            stop = self._stops.get(key)
            if stop is None:
                stop = self._stops[key] = Stop(0.0, 0.0, error)
            return stop

    def wait(self, key: K, seconds: float, error: Exception, now: float | None = None) -> None:
        """``key`` is not tried for ``seconds`` (it just worked, and its effect is not seen yet); a failure after
        that starts again from the first delay."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._stops[key] = Stop(now + seconds, 0.0, error)

    def again_now(self, key: K) -> None:
        """``key`` made progress: due again at once, and a failure after it starts from the first delay."""
        with self._lock:
            stop = self._stops.get(key)
            if stop is not None:
                stop.retry_at, stop.delay = 0.0, 0.0

    def later(self, key: K, seconds: float, now: float | None = None) -> None:
        """``key`` is not tried for ``seconds`` (something else works on it now); its delay stays."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stop = self._stops.get(key)
            if stop is not None:
                stop.retry_at = now + seconds

    def all_due(self) -> None:
        """Every key is due at once (a catch-up tries everything stopped once more)."""
        with self._lock:
            for stop in self._stops.values():
                stop.retry_at = 0.0

    def due(self, key: K, now: float | None = None, retry: bool = True) -> bool:
        """Is ``key`` to be tried now (not stopped, or its delay passed)? See :meth:`Stop.due`."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stop = self._stops.get(key)
            return stop is None or stop.due(now, retry)

    def next_in(self, now: float | None = None) -> float | None:
        """Seconds until the first key is due (0: one is due now; None: nothing is stopped)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._stops:
                return None
            return max(0.0, min(s.retry_at for s in self._stops.values()) - now)

    def get(self, key: K) -> Stop | None:
        with self._lock:
            return self._stops.get(key)

    def pop(self, key: K) -> Stop | None:
        """``key`` is no longer stopped; returns the stop it had."""
        with self._lock:
            return self._stops.pop(key, None)

    def drop(self, which: Callable[[K], bool]) -> None:
        """Forget every key for which ``which`` holds."""
        with self._lock:
            for key in [k for k in self._stops if which(k)]:
                del self._stops[key]

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._stops)

    def errors(self) -> dict[K, Exception]:
        with self._lock:
            return {k: s.error for k, s in self._stops.items()}

    def first_error(self) -> Exception | None:
        with self._lock:
            return next((s.error for s in self._stops.values()), None)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._stops

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())

    def __len__(self) -> int:
        with self._lock:
            return len(self._stops)
