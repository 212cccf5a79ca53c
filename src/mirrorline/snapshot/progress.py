"""Progress of a long load, on stderr: on a terminal a progress bar (tqdm) over the chunks with the rows and their
rate; otherwise a plain line every few seconds (for logs)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO


class Progress:
    """``update(rows=..., chunks=...)`` from the loading code (any thread); ``poll`` is called before each line for
    figures that come from elsewhere (Spark's task counts)."""

    def __init__(
        self,
        label: str,
        total_chunks: int,
        est_rows: int,
        *,
        stream: TextIO | None = None,
        every: float = 2.0,
        poll: Callable[[Progress], None] | None = None,
    ) -> None:
        self.label = label
        self.total_chunks = total_chunks
        self.est_rows = est_rows
        self.rows = 0
        self.exact = False  # rows is the count the tasks reported, no longer the estimate ``poll`` makes
        self.chunks = 0
        self.table = ""
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.poll = poll
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar: Any = None

    def update(self, rows: int = 0, chunks: int = 0, table: str | None = None) -> None:
        with self._lock:
            self.rows += rows
            self.chunks += chunks
            if table is not None:
                self.table = table

    def line(self) -> str:
        el = max(time.monotonic() - self.t0, 1e-6)
        pct = 100.0 * self.chunks / self.total_chunks if self.total_chunks else 100.0
        rate = self.rows / el
        where = f" {self.table}" if self.table else ""
        return (
            f"{self.label}:{where} {self.chunks}/{self.total_chunks} chunks ({pct:.0f}%), "
            f"{self.rows:,} rows, {rate:,.0f} rows/s, {el:.0f} s"
        )

    def _emit(self, final: bool = False) -> None:
        if self.poll is not None:
            with contextlib.suppress(Exception):  # progress must never break the load
                self.poll(self)
        if self._bar is not None:
            el = max(time.monotonic() - self.t0, 1e-6)
            self._bar.n = self.chunks
            where = f"{self.table}, " if self.table else ""
            self._bar.set_postfix_str(f"{where}{self.rows:,} rows, {self.rows / el:,.0f} rows/s", refresh=False)
            self._bar.refresh()
            if final:
                self._bar.close()
                self.stream.write(self.line() + "\n")
            return
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._emit()

    def __enter__(self) -> Progress:
        if self._tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total_chunks,
                desc=self.label,
                unit="chunk",
                file=self.stream,
                dynamic_ncols=True,
                leave=False,
            )
            self.every = min(self.every, 0.5)
        self._thread = threading.Thread(target=self._run, name="snapshot-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc[0] is None:
            self._emit(final=True)
        elif self._bar is not None:
            self._bar.close()
