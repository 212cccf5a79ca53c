"""Threads named at the OS as in Python (``mirrorline.osthreads``): what ``top -H`` and ``/proc/PID/task/TID/comm``
show, and what ``bench/bigtxn`` sums each thread's CPU by."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mirrorline.osthreads import name_threads, os_name

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names at the OS: Linux only")


def _seen() -> tuple[str, Any]:
    """This thread's name at the OS, and its profiler when it runs."""
    comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
    return comm, sys.getprofile()


def test_every_thread_started_is_named_at_the_os_and_left_unprofiled() -> None:
    seen: dict[str, tuple[str, Any]] = {}
    name_threads()
    try:
        for name in ("mirrorline-capture", "sqlite-checkpoint /var/lib/mirrorline/cache.db"):
            t = threading.Thread(target=lambda n=name: seen.__setitem__(n, _seen()), name=name)
            t.start()
            t.join()
        with ThreadPoolExecutor(1, thread_name_prefix="mirrorline-ahead-pg") as ex:
            seen["lane"] = ex.submit(_seen).result()
    finally:
        threading.setprofile(None)
    assert seen["mirrorline-capture"] == ("capture", None)
    assert seen["sqlite-checkpoint /var/lib/mirrorline/cache.db"] == ("sqlite-checkpoi", None)  # 15 bytes kept
    assert seen["lane"] == ("ahead-pg_0", None)
    t = threading.Thread(target=lambda: seen.__setitem__("after", _seen()), name="mirrorline-later")
    t.start()
    t.join()
    assert seen["after"][0] != "later"  # once the hook is taken away, threads keep the process's name


def test_names_are_cut_to_what_the_kernel_keeps() -> None:
    assert os_name("mirrorline-capture") == b"capture"
    assert os_name("apply-" + "x" * 30) == b"apply-xxxxxxxxx"
    assert len(os_name("mirrorline-ahead-é" * 3)) == 15
