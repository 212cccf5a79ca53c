"""Units that only insert and update: net rows from one hash aggregate, their images attached on the driver.

Catching up tables that are updated (pgbench's, an update-heavy load) gives units in which every table has only
inserts and updates: the log's statistics of the unit (segment footers) show no delete, TRUNCATE or key change, and
no change that marks columns unchanged. Under the rules (:mod:`mirrorline.compile.reference`, all of I, U and D
replicated) the only valid sequences of I and U on one key are an optional I followed by U's, and their net change is
one row at the key's last change: I when the key's first change is its I, else U, with the image of that last change.

So such a unit compiles on Spark without the fold: one shuffle of the changes' small columns (the images are not
read) into a hash aggregate per (table, key) of long integers only: how many I, the first position, the first I's
position, the last position. Positions are packed into one long, ``(lsn mod 2^39) << 24 | seq``: a unit whose lsns
differ above their low 39 bits (it crosses a multiple of 512 GiB of WAL) goes the general way, and a change that
does not fit (a transaction of more than 16M changes) counts as a key that is not simple. Only each net row's last
position and whether it is an insert come back through Arrow; the driver reads the rows at those positions
(:meth:`~mirrorline.log.ChangeLog.iter_at`: only the row groups holding some), whose table, key and image the net
rows take (:func:`attach`).

When every net row is an insert, the unit is given to apply as an inserts-only unit is
(:func:`mirrorline.compile.inserts.streamed`) as soon as Spark's job ends, its images read on in the background; its
check is that the driver read one image at each position.

The plan holds no literal that changes from unit to unit (``changes`` are the unit's rows already, read by
:func:`~mirrorline.log.spark.read_spark`), so Spark generates its code once and every later unit runs the same
classes, which the JIT has compiled by then (tests/compile/test_compile_codegen.py).

When some key's changes are not an optional I and U's (an invalid sequence, which the general path names) or do not
fit, :func:`compile_updates` returns None and the unit is compiled the general way.

What it costs is measured by ``bench/apply.py`` (update-heavy: 1M changes to 200,000 net rows, captured from
PostgreSQL), against PostgreSQL's own logical replication of the same changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.compile.inserts import streamed
from mirrorline.compile.reference import ALL_ACTIONS, Actions, actions_of
from mirrorline.errors import LogError
from mirrorline.log.stats import Stats
from mirrorline.model import TableSchema
from mirrorline.position import Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
RESULT_LIMIT = "spark.driver.maxResultSize"
SEQ_BITS = 24  # a packed position: (lsn mod 2^LSN_BITS) << SEQ_BITS | seq
LSN_BITS = 63 - SEQ_BITS
# the hint of the error when the rows Spark folded and the rows the driver read at their positions differ
_LOG_CHANGED = (
    "the log changed while it was read: check that only one capture writes to it and that no segment was changed "
    "or removed by hand, then run again"
)


def qualifies(stats: Stats, actions: Actions | None = None, bags: Mapping[str, object] | None = None) -> bool:
    """Does the unit with these statistics (of the tables it replicates) hold only inserts and updates that mark no
    columns unchanged, of tables that replicate every kind and have a key?"""
    if not stats:
        return False
    for table, s in stats.items():
        if actions_of(actions, table) != ALL_ACTIONS:
            return False
        if not set(s.first) <= {"I", "U"} or s.truncates or s.key_changes or s.marks != 0 or table in (bags or {}):
            return False
    return True


def compile_updates(
    changes: DataFrame,
    stats: Stats,
    start: Position,
    end: Position,
    read: Callable[[pa.Table], Iterable[pa.Table]],
    schemas: Mapping[str, TableSchema] | None = None,
) -> NetBatch | None:
    """Compile the unit ``(start, end]`` whose changes are ``changes`` (log layout, those of the unit only, as
    :func:`~mirrorline.log.spark.read_spark` gives them; :func:`qualifies` holds for ``stats``, their
    statistics); ``read`` reads the log's rows at the positions given (a table of ``lsn``, ``seq``) with their
    ``table``, ``key`` and ``new``, in chunks as they are read (:meth:`~mirrorline.log.ChangeLog.iter_at`). None
    when some key's changes are not an optional I followed by U's, their positions do not pack, or the net rows are
    more than ``spark.driver.maxResultSize`` lets the driver collect: compile the unit the general way.

    When every net row is an insert and the tables' schemas at ``end`` are given, the batch is returned as soon as
    Spark's job ends, its rows read on in the background (:func:`_stream_inserts`); else with its rows attached."""
    from pyspark.sql import functions as F

    window = min(p.lsn for s in stats.values() for p in s.first.values()) >> LSN_BITS
    if end.lsn >> LSN_BITS != window:
        log.info("unit %s..%s crosses a multiple of 2^%d bytes of WAL: compiled the general way", start, end, LSN_BITS)
        return None
    fits = (F.col("seq") >= 0) & (F.col("seq") < F.lit(1 << SEQ_BITS))
    pos = F.when(fits, F.shiftleft(F.col("lsn").bitwiseAND(F.lit((1 << LSN_BITS) - 1)), SEQ_BITS) + F.col("seq"))
    agg = changes.groupBy("table", "key").agg(
        F.count_if(F.col("op") == "I").alias("ni"),
        F.count_if(~(fits & F.col("op").isin("I", "U"))).alias("odd"),
        F.min(pos).alias("first"),
        F.min(F.when(F.col("op") == "I", pos)).alias("first_i"),
        F.max(pos).alias("last"),
    )
    simple = (F.col("odd") == 0) & ((F.col("ni") == 0) | ((F.col("ni") == 1) & (F.col("first_i") == F.col("first"))))
    try:
        got = agg.select(
            F.coalesce(simple, F.lit(False)).alias("simple"), (F.col("ni") == 1).alias("ins"), "last"
        ).toArrow()
    except Exception as e:
        if RESULT_LIMIT not in str(e):
            raise
        log.warning("a unit's net rows exceed %s: compiled the general way instead", RESULT_LIMIT)
        return None
    assert isinstance(got, pa.Table)
    if not pc.all(got["simple"]).as_py():
        return None
    order = [t for _, t in sorted((min(s.first.values()), t) for t, s in stats.items())]
    count = sum(s.count for s in stats.values())
    positions = _unpack(window, got["last"].to_numpy())
    if schemas is not None and got.num_rows and pc.all(got["ins"]).as_py():
        return _stream_inserts(positions, {t: schemas[t] for t in order}, start, end, read, count)
    return NetBatch(
        start=start,
        end=end,
        tables=order,
        rows=attach(positions.append_column("ins", got["ins"]), read).cast(NET_ARROW),
        changes=count,
        net_rows=got.num_rows,
    )


def _unpack(window: int, packed: np.ndarray) -> pa.Table:
    """Packed positions (see :data:`SEQ_BITS`) of the 2^39-byte window ``window`` of WAL as ``lsn``, ``seq``."""
    return pa.table(
        {"lsn": pa.array((window << LSN_BITS) | (packed >> SEQ_BITS)), "seq": pa.array(packed & ((1 << SEQ_BITS) - 1))}
    )


def _concat(chunks: Iterable[pa.Table]) -> pa.Table:
    parts = list(chunks)
    return (
        pa.concat_tables(parts)
        if parts
        else pa.table({"lsn": pa.array([], pa.int64()), "seq": pa.array([], pa.int64())})
    )


def _stream_inserts(
    positions: pa.Table,
    tables: Mapping[str, TableSchema],
    start: Position,
    end: Position,
    read: Callable[[pa.Table], Iterable[pa.Table]],
    count: int,
) -> NetBatch:
    """The unit whose net rows are all inserts, at ``positions`` (the last change of each key: its image is the
    row's), as an inserts-only unit is given to apply (:mod:`mirrorline.compile.inserts`): each table's rows a
    :class:`~mirrorline.compile.batch.Feed` of the images read so far, loaded as they come (on PostgreSQL, one COPY
    straight into the table), while the driver reads the rest. The batch's check (which reading a table's rows to their
    end waits for) raises the read's error, or a :class:`LogError` when the driver read other than one row at each
    position."""

    def check(got: int) -> None:
        if got != positions.num_rows:
            raise LogError(
                f"Spark found {positions.num_rows} net rows of {start}..{end} and the driver read {got} images at "
                "their positions",
                hint=_LOG_CHANGED,
                start=str(start),
                end=str(end),
            )

    return streamed(start, end, tables, read(positions), check, count, net_rows=positions.num_rows)


def attach(net: pa.Table, read: Callable[[pa.Table], Iterable[pa.Table]]) -> pa.Table:
    """The net rows at the positions ``net`` gives (``lsn``, ``seq``, and ``ins``: is the row an insert, else an
    update) in the :data:`~mirrorline.compile.batch.NET_ARROW` layout: the table, key and image of each are the log's
    row there, which ``read`` reads (positions in, rows with ``lsn``, ``seq``, ``table``, ``key`` and ``new`` out).
    Raises :class:`LogError` when a position is missing there or found twice: the rows Spark folded and the rows the
    driver read differ."""
    n = net.num_rows
    if n == 0:
        return NET_ARROW.empty_table()
    at = pa.table({"lsn": net["lsn"], "seq": net["seq"], "_ni": pa.array(np.arange(n, dtype=np.int64))})
    images = _concat(read(at.select(["lsn", "seq"])))
    have = pa.table(
        {"lsn": images["lsn"], "seq": images["seq"], "_ii": pa.array(np.arange(images.num_rows, dtype=np.int64))}
    )
    found = at.join(have, ["lsn", "seq"], join_type="inner")
    seen = np.zeros(n, dtype=bool)
    seen[found["_ni"].to_numpy()] = True
    if found.num_rows != n or int(seen.sum()) != n:
        raise LogError(
            f"Spark found {n} net rows with an image and the driver read {found.num_rows} images at their positions",
            hint=_LOG_CHANGED,
        )
    rows = images.take(found["_ii"])
    return pa.table(
        {
            "table": rows["table"],
            "kind": pc.if_else(net["ins"].take(found["_ni"]), "I", "U"),
            "key": rows["key"],
            "new": rows["new"],
            "unchanged": pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string())),
            "lsn": rows["lsn"],
            "seq": rows["seq"],
            "moved_from": pa.nulls(n, NET_ARROW.field("moved_from").type),
        }
    )
