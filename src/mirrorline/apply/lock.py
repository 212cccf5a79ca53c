"""One applier per target at a time (DESIGN §6): a lock at the target, held while a unit is applied (and while
``verify`` catches a target up and reads it), so that a second process beside ``run`` waits its turn or is told who
holds it, and never applies the same changes twice.

- A file kind (SQLite, DuckDB, Delta): ``flock`` on a lock file beside the database (in the Delta folder), holding
  the holder's description.
- PostgreSQL: a session advisory lock keyed on the target's state table (so two instances with their own
  ``state_prefix`` do not exclude each other), held by a connection of its own whose ``application_name`` names the
  holder.

Within one process the lock is re-entrant (``verify`` holds it while its own catch-up applies).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from mirrorline.errors import TargetError


class TargetBusy(TargetError):
    """Another process holds the target's applier lock."""

    retryable = True


def holder_text() -> str:
    cmd = " ".join(os.path.basename(a) for a in sys.argv[:2]) or "python"
    return (
        f"pid {os.getpid()} on {socket.gethostname()} ({cmd}), since {datetime.now(UTC).isoformat(timespec='seconds')}"
    )


class Lockable(Protocol):
    name: str

    def lock_key(self) -> str: ...

    def try_lock(self) -> Any: ...

    def unlock(self, handle: Any) -> None: ...

    def lock_holder(self) -> str: ...


_held: dict[str, list[Any]] = {}  # lock key -> [count, handle], this process's
_held_guard = threading.Lock()


def held_here(target: Lockable) -> bool:
    """Does this process hold ``target``'s applier lock now?"""
    with _held_guard:
        return target.lock_key() in _held


@contextlib.contextmanager
def exclusive(target: Lockable, wait: float) -> Iterator[None]:
    """Hold ``target``'s applier lock for the block, waiting up to ``wait`` seconds for another process to release
    it; :class:`TargetBusy` naming the holder after that."""
    key = target.lock_key()
    with _held_guard:
        entry = _held.get(key)
        if entry is not None:
            entry[0] += 1
    if entry is None:
        deadline = time.monotonic() + wait
        while True:
            handle = target.try_lock()
            if handle is not None:
                break
            if time.monotonic() >= deadline:
                raise TargetBusy(
                    f"target {target.name}: another process applies to it ({target.lock_holder()})",
                    hint="one process applies to a target at a time: stop the other one, or let it finish",
                    target=target.name,
                )
            time.sleep(0.05)
        with _held_guard:
            _held[key] = [1, handle]
    try:
        yield
    finally:
        with _held_guard:
            entry = _held[key]
            entry[0] -= 1
            done = entry[0] == 0
            if done:
                del _held[key]
        if done:
            target.unlock(entry[1])


class FileLock:
    """The lock of a file kind: ``flock`` on ``path`` (created 0600), which holds the holder's description."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def try_lock(self, target: str) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise TargetError(
                f"target {target}: cannot create its lock file {self.path}: {e.strerror or e}",
                hint="check that the target's folder exists and is writable",
                target=target,
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, holder_text().encode())
        return fd

    @staticmethod
    def unlock(fd: int) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "a process that did not say"
        except OSError:
            return "unknown"
