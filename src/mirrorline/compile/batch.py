"""The output of compiling one unit of work: net row changes per table (DESIGN §5). The contract between compile and
apply; it does not depend on the target, so one compiled batch serves every target.

``net`` is a Spark DataFrame with one row per net change:

=============  ====================  ===========================================================================
column         type                  meaning
=============  ====================  ===========================================================================
table          string                "schema.name"
kind           string                "D" (delete this key), "U" (update to this image), "I" (insert this image)
key            array<string>         the key values, in the table's key-column order
new            map<string,string>    the image for U and I (null for D); columns marked unchanged are absent
unchanged      array<string>         columns not sent and not seen in the unit: for U, keep the target row's value;
                                     for I, take it from the target's row at ``moved_from``
lsn, seq       bigint, bigint        position of the last change folded into this net change
moved_from     array<string>         for an I whose ``unchanged`` is not empty: the key of the row, at the target
                                     as it is before the unit, that supplies those columns (a key-changing update
                                     whose TOASTed columns were not sent; the first key of a chain a->b->c); else
                                     null. Nullable: units stored before it existed read as null.
=============  ====================  ===========================================================================

A "replace" (delete then insert of one key) is two rows, kind D and kind I. Apply runs, per table in ``tables``
order: TRUNCATE if the table is in ``truncated``, then the deletes, then the updates, then the inserts; the
unchanged columns of the inserts are read from the rows at ``moved_from`` before the table's TRUNCATE and deletes (a
missing row there is an error, never a NULL). The "mirror" form of an update is a D and an I with ``moved_from`` =
its own key.

A unit in which every table only inserts (:mod:`mirrorline.compile.inserts`) holds its net rows on the driver already
flattened, per table (:class:`Inserts`): the same rows as kind I with ``unchanged`` empty and ``moved_from`` null.
Such a unit is handed to apply while its rows are still being read (:class:`Feed`) and before Spark has checked that
no key repeats: apply loads them as they come. The batch settles itself: reading a table's rows to their end waits
for the unit's check and raises what it found (:meth:`NetBatch.verify`), so that rows read whole are rows that may
be committed; :class:`~mirrorline.errors.Unverified` then means the unit must be compiled the general way. A target
whose bulk statement fails before it read every row asks :meth:`NetBatch.verify` before it takes the failure path
(apply/engine.py), so that a unit its route compiled wrongly is compiled again rather than applied change by change.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from mirrorline import limits, scratch
from mirrorline.errors import LogError
from mirrorline.position import Position
from mirrorline.sparkenv import get_spark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")

NET_DDL = (
    "`table` STRING NOT NULL, kind STRING NOT NULL, key ARRAY<STRING> NOT NULL, new MAP<STRING, STRING>, "
    "unchanged ARRAY<STRING> NOT NULL, lsn BIGINT NOT NULL, seq BIGINT NOT NULL, moved_from ARRAY<STRING>"
)

NET_ARROW = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key", pa.list_(pa.string()), nullable=False),
        pa.field("new", pa.map_(pa.string(), pa.string())),
        pa.field("unchanged", pa.list_(pa.string()), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("moved_from", pa.list_(pa.string())),
    ]
)


POSITION_COLUMNS = ("_ml_lsn", "_ml_seq")  # the position of each row of an Inserts table


class Feed:
    """Tables produced one after another by a background reader, read as they come (:meth:`chunks`, by any number
    of readers) or whole (:meth:`table`). The reader's error, if it fails, is raised to every reader once the chunks
    before it are read. A reader reaches the end only once the feed's ``gate`` passes (its batch's check: see
    :meth:`NetBatch.verify`), so that whoever has read every row may commit them.

    What it holds in memory is bounded by ``budget`` bytes: past it, the oldest chunks are written to a scratch file
    (Arrow IPC, the producer's thread) and read back from it by whoever reads them later. Readers that keep up read
    every chunk from memory; one that falls behind (a slower target) reads from the file. So the rows of a unit of
    1M rows of 2 kB held by its feed are about ``budget``, not 2 GB; what the process holds besides (each target's
    own copy as it loads) is not bounded here (``bench/bigtxn.py --tables wide --shapes insert`` reports both)."""

    def __init__(self, schema: pa.Schema, budget: int | None = None) -> None:
        self.schema = schema
        self.gate: Callable[[], None] | None = None  # raises when the rows must not be used (set by the NetBatch)
        self.budget = limits.FEED_BYTES if budget is None else budget
        self._chunks: list[pa.Table | _Spilled] = []
        self._spilled = 0  # the chunks before this index are in the file (the oldest go first)
        self._held = 0  # bytes of the chunks in memory
        self._rows = 0
        self._spill: _SpillFile | None = None
        self._cond = threading.Condition()
        self._done = False
        self._discarded = False
        self._error: BaseException | None = None

    def put(self, chunk: pa.Table) -> None:
        with self._cond:
            self._chunks.append(chunk)
            self._held += chunk.nbytes
            self._rows += chunk.num_rows
            self._cond.notify_all()
        self._bound()

    def _bound(self) -> None:
        """Write the oldest chunks held in memory to the file until the rest fit the budget (the newest stays:
        readers that keep up are reading it). Called by the producer alone, so one writer."""
        while True:
            with self._cond:
                i = self._spilled
                if self._held <= self.budget or i >= len(self._chunks) - 1:
                    return
                chunk = self._chunks[i]
            assert isinstance(chunk, pa.Table)
            if self._spill is None:
                self._spill = _SpillFile()
            where = self._spill.write(chunk)
            with self._cond:
                self._chunks[i] = where
                self._spilled = i + 1
                self._held -= chunk.nbytes

    def close(self, error: BaseException | None = None) -> None:
        """No more chunks: the reader ended (with ``error``, when it failed)."""
        with self._cond:
            self._done, self._error = True, error
            self._cond.notify_all()

    def discard(self) -> None:
        """Drop the chunks and remove the file (the unit is applied; reading after this is an error)."""
        with self._cond:
            self._chunks, self._spilled, self._held = [], 0, 0
            spill, self._spill = self._spill, None
            self._discarded = True
        if spill is not None:
            spill.remove()

    @property
    def held(self) -> int:
        """Bytes of chunks held in memory now."""
        return self._held

    def chunks(self, gated: bool = True) -> Iterator[pa.Table]:
        """The chunks as they come; at the end, the gate (``gated``: the route's own check reads without it)."""
        i = 0
        while True:
            with self._cond:
                if self._discarded:
                    raise RuntimeError("a feed's rows were read after its unit was released")
                while i >= len(self._chunks) and not self._done:
                    self._cond.wait()
                if i < len(self._chunks):
                    chunk = self._chunks[i]
                    spill = self._spill
                elif self._error is not None:
                    raise self._error
                else:
                    break
            i += 1
            if isinstance(chunk, _Spilled):
                assert spill is not None
                chunk = spill.read(chunk)
            yield chunk
        if gated and self.gate is not None:
            self.gate()

    def table(self) -> pa.Table:
        parts = list(self.chunks())
        return pa.concat_tables(parts) if parts else self.schema.empty_table()

    def rows(self) -> int:
        """How many rows were produced, once the reader has ended (its error raised; the gate not asked)."""
        with self._cond:
            while not self._done:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            return self._rows


@dataclass(frozen=True)
class _Spilled:
    """Where a chunk lies in a feed's file."""

    offset: int
    length: int


class _SpillFile:
    """A feed's chunks past its budget: one Arrow IPC stream per chunk, appended to a file of the process's scratch
    folder (removed with the feed, or by the next mirrorline process if this one is killed)."""

    def __init__(self) -> None:

        self.folder = scratch.mkdtemp("feed-")
        self.path = os.path.join(self.folder, "chunks.arrows")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._end = 0

    def write(self, chunk: pa.Table) -> _Spilled:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, chunk.schema) as w:
            w.write_table(chunk)
        data = memoryview(sink.getvalue())
        at, done = self._end, 0
        while done < len(data):
            done += os.pwrite(self._fd, data[done:], at + done)
        self._end += len(data)
        return _Spilled(at, len(data))

    def read(self, where: _Spilled) -> pa.Table:
        parts, done = [], 0
        while done < where.length:
            part = os.pread(self._fd, where.length - done, where.offset + done)
            if not part:
                raise LogError(
                    f"a compiled unit's scratch file {self.path} ends before its chunk at {where.offset}",
                    hint="something removed or truncated the scratch folder while the unit was applied: run again",
                )
            parts.append(part)
            done += len(part)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        shutil.rmtree(self.folder, ignore_errors=True)


class Inserts:
    """One table's net rows when they are all inserts of complete images: one text column per column of the table
    (its values as PostgreSQL's text, null for NULL), then the position of each row (int64 columns named
    :data:`POSITION_COLUMNS`); ``key`` names the key columns. Rows in no particular order. Given whole (``rows``) or
    as a :class:`Feed` still being read, whose chunks :meth:`chunks` gives as they come (``rows`` waits for them
    all)."""

    def __init__(self, rows: pa.Table | None, key: tuple[str, ...], feed: Feed | None = None) -> None:
        if rows is None and feed is None:
            raise ValueError("Inserts needs its rows or a feed of them")
        self._rows = rows
        self.key = key
        self.feed = feed
        self._lock = threading.Lock()

    @property
    def rows(self) -> pa.Table:
        with self._lock:
            if self._rows is None:
                assert self.feed is not None
                self._rows = self.feed.table()
            return self._rows

    def chunks(self) -> Iterator[pa.Table]:
        """The rows in chunks, each as soon as it is read."""
        if self._rows is not None or self.feed is None:
            yield self.rows
        else:
            yield from self.feed.chunks()

    @property
    def count(self) -> int:
        """How many rows (waits for the feed's reader to end, without holding them all)."""
        with self._lock:
            if self._rows is not None or self.feed is None:
                return self.rows.num_rows if self._rows is not None else 0
        return self.feed.rows()

    @property
    def columns(self) -> list[str]:
        return [c for c in self.rows.column_names if c not in POSITION_COLUMNS]

    def to_net(self, table: str) -> pa.Table:
        """The same rows in the :data:`NET_ARROW` layout (a column's null value is a null entry of ``new``)."""
        n = self.rows.num_rows
        cols = self.columns
        width = len(cols)
        offsets = pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32) if width else np.zeros(n + 1, np.int32))
        names = pa.array(np.tile(np.array(cols, dtype=object), n), pa.string())
        values = (
            pa.concat_arrays([self.rows[c].combine_chunks().cast(pa.string()) for c in cols])
            if width
            else (pa.array([], pa.string()))
        )
        interleave = (
            np.arange(n * width, dtype=np.int64).reshape(width, n).T.reshape(-1) if width else np.array([], np.int64)
        )
        new = pa.MapArray.from_arrays(offsets, names, values.take(pa.array(interleave)))
        key_cols = [self.rows[k].combine_chunks().cast(pa.string()) for k in self.key]
        k_offsets = pa.array(
            np.arange(0, (n + 1) * len(key_cols), len(key_cols), dtype=np.int32)
            if key_cols
            else np.zeros(n + 1, np.int32)
        )
        k_values = (
            pa.concat_arrays(key_cols).take(
                pa.array(np.arange(n * len(key_cols), dtype=np.int64).reshape(len(key_cols), n).T.reshape(-1))
            )
            if key_cols
            else pa.array([], pa.string())
        )
        return pa.table(
            {
                "table": pa.array([table] * n, pa.string()),
                "kind": pa.array(["I"] * n, pa.string()),
                "key": pa.ListArray.from_arrays(k_offsets, k_values),
                "new": new,
                "unchanged": pa.array([[]] * n, pa.list_(pa.string())),
                "lsn": self.rows[POSITION_COLUMNS[0]],
                "seq": self.rows[POSITION_COLUMNS[1]],
                "moved_from": pa.nulls(n, pa.list_(pa.string())),
            },
            schema=NET_ARROW,
        )


@dataclass
class NetBatch:
    """A compiled unit. Its net rows are a Spark DataFrame (``net``) or, for a unit compiled small enough to come
    back to the driver (:mod:`mirrorline.compile.small`), an Arrow table (``rows``, the same layout); ``frame()``
    gives a DataFrame either way."""

    start: Position  # exclusive: the unit holds the changes after this position ...
    end: Position  # ... up to and including this one
    tables: list[str]  # every table with a change in the unit, in the order of its first change
    net: DataFrame | None = None
    truncated: dict[str, Position] = field(default_factory=dict)  # table -> position of its last TRUNCATE
    changes: int = 0  # how many log changes the unit held
    scratch: str | None = field(default=None, repr=False)  # a local folder holding ``net``'s files, if temporary
    rows: pa.Table | None = field(default=None, repr=False)  # the net rows on the driver, when compiled there
    inserts: dict[str, Inserts] | None = field(default=None, repr=False)  # an inserts-only unit's rows, flat
    net_rows: int | None = None  # how many net rows (D, U, I) ``net`` holds, when known
    # what must hold before any of the unit is committed (raises Unverified, or the reader's error), and a wait for
    # the background work the route left running (release() waits for it): see compile/inserts.py
    check: Callable[[], None] | None = field(default=None, repr=False)
    settle: Callable[[], None] | None = field(default=None, repr=False)
    # the versions of the unit's tables some target keeps in versions, set-based (compile/history.py): table ->
    # Frames; a table missing here is derived by apply from the unit's changes
    history: dict[str, Any] = field(default_factory=dict, repr=False)
    _derived: dict[Hashable, _Once] = field(default_factory=dict, init=False, repr=False, compare=False)
    _derived_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _verified: list[BaseException | None] = field(default_factory=list, init=False, repr=False, compare=False)
    _verify_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.net is None and self.rows is None and self.inserts is None:
            raise ValueError("a NetBatch needs its net rows: net (a DataFrame), rows (an Arrow table) or inserts")
        if self.check is not None:
            for ins in (self.inserts or {}).values():
                if ins.feed is not None:
                    ins.feed.gate = self.verify

    @property
    def on_driver(self) -> bool:
        """Are the net rows in the driver's memory (no Spark job to read them)?"""
        return self.rows is not None or self.inserts is not None

    def arrow(self) -> pa.Table | None:
        """The net rows on the driver in the :data:`NET_ARROW` layout, when they are there."""
        if self.rows is None and self.inserts is not None:
            parts = [self.inserts[t].to_net(t) for t in self.tables if t in self.inserts]
            self.rows = pa.concat_tables(parts) if parts else NET_ARROW.empty_table()
        return self.rows

    def frame(self, spark: SparkSession | None = None) -> DataFrame:
        """The net rows as a DataFrame (made from ``rows`` on first use when the unit came back to the driver)."""
        if self.net is None:
            if spark is None:
                spark = get_spark()
            rows = self.arrow()
            assert rows is not None
            self.net = spark.createDataFrame(rows, schema=NET_DDL)
        return self.net

    def counts(self) -> dict[str, dict[str, int]]:
        """``{table: {"D": n, "U": n, "I": n}}`` for every table in ``tables`` (a small Spark job, unless the rows
        are on the driver)."""
        out = {t: {"D": 0, "U": 0, "I": 0} for t in self.tables}
        if self.rows is None and self.inserts is not None:
            for t, ins in self.inserts.items():
                out.setdefault(t, {"D": 0, "U": 0, "I": 0})["I"] = ins.count
            return out
        if self.rows is not None:
            pairs = self.rows.group_by(["table", "kind"]).aggregate([([], "count_all")]).to_pylist()
            for r in pairs:
                out.setdefault(r["table"], {"D": 0, "U": 0, "I": 0})[r["kind"]] = int(r["count_all"])
            return out
        for r in self.frame().groupBy("table", "kind").count().collect():
            out.setdefault(r["table"], {"D": 0, "U": 0, "I": 0})[r["kind"]] = int(r["count"])
        return out

    def derive(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, computed once per ``key`` for this batch and shared: what every target would derive alike
        from the net rows (apply's worktable rows of a table) is computed by the first that needs it while the
        others wait for it. A ``make`` that raises is not remembered (the next caller tries again). ``release()``
        drops what was derived."""
        with self._derived_lock:
            once = self._derived.get(key)
            if once is None:
                once = self._derived[key] = _Once()
        return once.get(make)

    def verify(self) -> None:
        """Wait for the unit's check, if its route left one running (``check``); raise what it found (the same for
        every caller): :class:`~mirrorline.errors.Unverified` when the unit must be compiled the general way.
        Reading an inserts table's rows to their end asks it (the feed's gate); the pipeline asks it before it
        takes a target's failure as the target's own."""
        if self.check is None:
            return
        with self._verify_lock:
            if not self._verified:
                try:
                    self.check()
                    self._verified.append(None)
                except BaseException as e:
                    self._verified.append(e)
            error = self._verified[0]
        if error is not None:
            raise error

    def release(self) -> None:
        """Free the net rows' scratch files once every target has applied them (``net`` is unusable after).
        Waits for the background work the unit's route left running."""
        if self.settle is not None:
            self.settle()
        with self._derived_lock:
            self._derived.clear()
        self.rows = None
        for ins in (self.inserts or {}).values():
            if ins.feed is not None:
                ins.feed.discard()
        self.inserts = None
        if self.scratch is not None:
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


class _Once:
    """A value computed by the first caller; the others wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None

    def get(self, make: Callable[[], Any]) -> Any:
        with self._lock:
            if not self._done:
                self._value = make()
                self._done = True
            return self._value
