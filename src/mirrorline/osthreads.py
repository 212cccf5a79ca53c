"""Python's thread names as the operating system shows them: ``top -H``, ``ps -L`` and ``/proc/PID/task/TID/comm``
name mirrorline's threads (``capture``, ``ahead-sqlite_0``, ``apply-pg_1``, ``log_0``...) instead of all ``python``,
so that where a process's CPU goes can be read per thread (``bench/bigtxn``'s ``cpu_s``). Linux only; the name is cut
to the 15 bytes the kernel keeps, after the ``mirrorline-`` every one of them would start with."""

from __future__ import annotations

import ctypes
import sys
import threading
from types import FrameType
from typing import Any

_PR_SET_NAME = 15
_PREFIX = "mirrorline-"
_libc: Any = None


def os_name(name: str) -> bytes:
    """The name the kernel is given for a Python thread named ``name``: 15 bytes at most, without the prefix."""
    return name.removeprefix(_PREFIX).encode("utf-8", "replace")[:15]


def _set(name: str) -> None:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(os_name(name)), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the names stay as they were
        pass


def _hook(frame: FrameType, event: str, arg: Any) -> None:
    """A new thread's first profiling event: name it, and profile nothing more."""
    sys.setprofile(None)
    _set(threading.current_thread().name)


def name_threads() -> None:
    """From now on, every thread started is named at the OS as it is in Python (:func:`os_name`)."""
    if sys.platform.startswith("linux"):
        threading.setprofile(_hook)
