"""Compile one unit of work into net row changes on Spark (DESIGN §5): log rows in, :class:`NetBatch` out.

The rules are those of :mod:`mirrorline.compile.reference` (the oracle, whose docstring states them in full); this
module computes the same result with Spark SQL expressions only (no Python on the executors, nothing but a few small
lists on the driver):

1. Per table: its first kept change (the table order), its count, its TRUNCATEs' positions and whether it has key
   changes. From the log's statistics of the unit when given (sums of segment footers: no job), else from one small
   job (hash aggregates over four columns; a second small query fetches TRUNCATE positions when there are some).
2. Key-changing updates become D(old key) then I(new key) (``sub`` 0 and 1 order them inside their position); kinds
   the table's actions exclude are dropped; each change gets its *epoch*, the number of the table's TRUNCATEs before
   it.
3. One shuffle groups the ops per (table, epoch, key) into a list sorted by position (see :func:`_plan` for how the
   sort stays cheap). The fold (:mod:`mirrorline.compile.fold_sql`) reads that list as a string of kinds
   (``"IUUD"``): validity is the absence of a forbidden pair (``II``, ``UI``, ``DU``, ``DD``, found with
   ``regexp_instr``, which also gives both positions) or of a first U/D after a TRUNCATE; whether the row existed
   before the unit and after it, and whether it was replaced on the way, are read from the first and last kinds and
   from where the last I and the D's are. Only a last image that marks columns unchanged goes through the lambda
   that looks back for their latest values.
4. The net rows of the last epoch of each table (plus one ``E`` row per invalid key) are written once as Parquet;
   reading back the E rows gives the earliest error. The batch's ``net`` reads that Parquet: call
   ``NetBatch.release()`` once applied. Or, for a unit whose net rows fit the driver (``to_driver``), the same job
   brings them there through Arrow, E rows included, and the earliest E row is found there (bench/apply.py,
   update-heavy, 1M changes to 200,000 net rows: 0.6 to 2 s less than the Parquet round trip and the apply's reads
   of it).
5. Only when the unit has key changes that do not send some (TOASTed) columns: the fold also writes one handoff
   (``H`` row) per such change (see :mod:`mirrorline.compile.fold_sql`) to a first scratch Parquet; handoffs that
   come from an earlier key change of the old key (chains a->b->c) are resolved by joining them with the handoffs,
   once per link of the longest chain; then each I whose image came from such a change takes the values its
   handoff found and names in ``moved_from`` the key whose row at the target holds the rest. The first pass writes
   the rows the second reads (H, E, and those I) apart from the net rows that are final as they are, whose files
   are then moved into the batch's folder beside the second pass's, not read and written again.

Performance (bench/compile.py): the Parquet scan of the log rows (the ``new`` map dominates) and the one shuffle of
the images are most of the time; everything else is a few string functions per key.

The general route's plan is one chain of DataFrame expressions whose steps (numbered below) share their column
names, so it stays in one module: split, a step would be read without the columns it relies on. The compile tests'
helpers over it are in ``tests/support/compile_support.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from mirrorline.compile.batch import NET_ARROW, NET_DDL, NetBatch
from mirrorline.compile.fold_sql import SORTED_OPS, fold_steps, handoff_op
from mirrorline.compile.reference import ALL_ACTIONS, Actions, Bags, normalised
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.stats import Stats
from mirrorline.model import kept_kinds
from mirrorline.position import ZERO, Position
from mirrorline.scratch import mkdtemp as scratch_dir

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)
_RESULT_LIMIT = "spark.driver.maxResultSize"


def _by_table(values: Mapping[str, Column], default: Column) -> Column:
    """A column that takes ``values[table]`` for the tables listed, ``default`` for the others: one map literal
    lookup, so that the plan stays the same size however many tables the unit holds."""
    from pyspark.sql import functions as F

    if not values:
        return default
    lookup = F.create_map(*[x for t, v in values.items() for x in (F.lit(t), v)])
    return F.coalesce(F.try_element_at(lookup, F.col("table")), default)


def _acts(actions: Actions | None) -> dict[str, frozenset[str]]:
    """The tables whose actions are not all of I, U, D."""
    return normalised(actions)


def _kept(kinds: Column, acts: Mapping[str, frozenset[str]]) -> Column:
    """Is ``kinds`` (a string column holding one of I, U, D, T) kept by the table's actions? T goes with D."""
    from pyspark.sql import functions as F

    kept = {t: F.array(*[F.lit(k) for k in sorted(kept_kinds(a))]) for t, a in acts.items()}
    return F.array_contains(_by_table(kept, F.array(*[F.lit(k) for k in "DITU"])), kinds)


_POS_SCALE = 10**19
_ERR_DDL = (
    "err STRUCT<first_op: STRING, first_lsn: BIGINT, first_seq: BIGINT, second_op: STRING, second_lsn: BIGINT, "
    "second_seq: BIGINT, second_sub: INT>"
)


_MOVES_DDL = "plsn BIGINT, pseq BIGINT"
_MOVES_PART = "_mirrorline_final"  # the first pass's partition column in the moves form: see _final


def _dec_pos(d: Any) -> Position:
    lsn, seq = divmod(int(d), _POS_SCALE)
    return Position(lsn, seq)


def _after(pos: Position) -> Column:
    """Rows after ``pos``, as a predicate Parquet can push down."""
    from pyspark.sql import functions as F

    return (F.col("lsn") > F.lit(pos.lsn)) | ((F.col("lsn") == F.lit(pos.lsn)) & (F.col("seq") > F.lit(pos.seq)))


def _pos_struct(pos: Position) -> Column:
    from pyspark.sql import functions as F

    return F.struct(F.lit(pos.lsn).cast("bigint").alias("lsn"), F.lit(pos.seq).cast("bigint").alias("seq"))


@contextmanager
def _conf(spark: Any, key: str, value: str) -> Iterator[None]:
    """The session's setting ``key`` at ``value`` while the block runs."""
    before = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, before)


def _sort_aggregate(spark: Any) -> contextlib.AbstractContextManager[None]:
    """Plan collect_list as a sort aggregate while the fold is planned and run. Its input is already partitioned and
    sorted by key, so the aggregate streams; the default object-hash aggregate would add a partial aggregation that
    merges nothing and fall back to sorting everything again past 128 keys."""
    return _conf(spark, "spark.sql.execution.useObjectHashAggregateExec", "false")


@dataclass
class _Plan:
    tables: list[str]
    truncs: dict[str, list[Position]]
    changes: int
    last: Position | None
    net_all: DataFrame  # net rows plus one E row (with ``err``) per invalid key sequence
    moves: bool  # key changes that do not send some columns: net_all also holds H rows, plsn and pseq


_ROWS_PER_FOLD_TASK = 250_000


def _parallelism(spark: Any) -> int:
    return max(1, int(spark.sparkContext.defaultParallelism))


def _fold_partitions(n_changes: int, parallelism: int) -> int:
    """Partitions of the fold's shuffle: about ``_ROWS_PER_FOLD_TASK`` changes each, in whole waves of
    ``parallelism`` tasks (5 tasks on 2 cores would leave one core idle in the last wave), at most 400."""
    tasks = max(2, -(-n_changes // _ROWS_PER_FOLD_TASK))
    waves = -(-tasks // parallelism)
    return min(400, max(2, waves * parallelism))


@dataclass
class _TableMeta:
    table: str
    n: int
    first: Position | None  # first kept change
    last: Position
    truncs: list[Position]  # kept TRUNCATEs
    key_changes: int
    moves: int


def _meta_job(changes: DataFrame, acts: Mapping[str, frozenset[str]], key_change: Column) -> list[_TableMeta]:
    """The per-table metadata from the rows themselves: one small job (and a second, rare, for TRUNCATEs)."""
    from pyspark.sql import functions as F

    kept_row = _kept(F.col("op"), acts)
    if acts:  # a key change is kept when its D or its I is
        kept_row = F.when(key_change, _kept(F.lit("D"), acts) | _kept(F.lit("I"), acts)).otherwise(kept_row)

    # positions as one decimal (lsn * 10^19 + seq, exact: both are below 2^63) so that min/max stay hash aggregates
    pos_dec = F.col("lsn").cast("decimal(38,0)") * F.expr(f"CAST({_POS_SCALE} AS DECIMAL(38,0))") + F.col("seq")
    rows = (
        changes.groupBy("table")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min(F.when(kept_row, pos_dec)).alias("first"),
            F.max(pos_dec).alias("last"),
            F.count_if((F.col("op") == "T") & kept_row).alias("truncs"),
            F.count_if(key_change).alias("key_changes"),
            F.count_if(key_change & (F.size("unchanged") > 0)).alias("moves"),
        )
        .collect()
    )
    truncs: dict[str, list[Position]] = {}
    if any(r["truncs"] for r in rows):  # rare: a second small query for their positions
        for r in changes.where((F.col("op") == "T") & kept_row).select("table", "lsn", "seq").collect():
            truncs.setdefault(r["table"], []).append(Position(r["lsn"], r["seq"]))
    return [
        _TableMeta(
            r["table"],
            int(r["n"]),
            _dec_pos(r["first"]) if r["first"] is not None else None,
            _dec_pos(r["last"]),
            truncs.get(r["table"], []),
            int(r["key_changes"]),
            int(r["moves"]),
        )
        for r in rows
    ]


def _meta_from_stats(stats: Stats, acts: Mapping[str, frozenset[str]]) -> list[_TableMeta]:
    """The same metadata from the log's statistics of the unit (:meth:`ChangeLog.stats`): no job."""
    out = []
    for table, st in stats.items():
        kept = acts.get(table, ALL_ACTIONS)
        out.append(
            _TableMeta(
                table,
                st.count,
                st.first_kept(kept),
                st.last,
                list(st.truncates) if "T" in kept_kinds(kept) else [],
                st.key_changes,
                st.moves,
            )
        )
    return out


def _plan(
    changes: DataFrame,
    actions: Actions | None,
    start: Position | None,
    end: Position | None,
    stats: Stats | None = None,
    meta: list[_TableMeta] | None = None,
    single: bool = False,
    bags: Bags | None = None,
) -> _Plan:
    """The unit's net rows as a plan. ``meta``: the tables' metadata as given (else from ``stats``, else from a
    job). ``single``: group in one partition without a shuffle (a small unit whose rows are already in one).
    ``bags``: the tables without a key, with their columns (folded as bags of rows)."""
    from pyspark.sql import functions as F

    if start is not None:
        changes = changes.where(_after(start))
    if end is not None:
        changes = changes.where(~_after(end))
    acts = _acts(actions)

    # 1. per table: first kept change, TRUNCATEs, count (small: one row per table)
    key_change = (F.col("op") == "U") & F.col("old_key").isNotNull() & ~F.col("old_key").eqNullSafe(F.col("key"))
    if meta is None:
        meta = _meta_from_stats(stats, acts) if stats is not None else _meta_job(changes, acts, key_change)
    first_seen = sorted((m.first, m.table) for m in meta if m.first is not None)
    n_changes = sum(m.n for m in meta)
    last = max((m.last for m in meta), default=None)
    truncs = {m.table: sorted(m.truncs) for m in meta if m.truncs}

    # 2. effective ops: key changes split (only when there are some), kinds filtered, epochs
    if any(m.key_changes for m in meta):
        parts = F.when(
            key_change,
            F.array(
                F.struct(F.lit("D").alias("kind"), F.col("old_key").alias("k"), F.lit(0).alias("sub")),
                F.struct(F.lit("I").alias("kind"), F.col("key").alias("k"), F.lit(1).alias("sub")),
            ),
        ).otherwise(F.array(F.struct(F.col("op").alias("kind"), F.col("key").alias("k"), F.lit(0).alias("sub"))))
        ops = changes.where(F.col("op") != "T").select("table", "lsn", "seq", "new", "unchanged", F.inline(parts))
    else:
        ops = changes.where(F.col("op") != "T").select(
            "table",
            "lsn",
            "seq",
            "new",
            "unchanged",
            F.col("op").alias("kind"),
            F.col("key").alias("k"),
            F.lit(0).alias("sub"),
        )
    moves = any(m.moves for m in meta)
    if acts and moves:  # the D of a key change marking columns stays as "d" when D is dropped: the I needs its values
        marker = (F.col("kind") == "D") & (F.col("sub") == 0) & F.col("new").isNotNull() & (F.size("unchanged") > 0)
        kept = _kept(F.col("kind"), acts)
        ops = ops.where(kept | (marker & _kept(F.lit("I"), acts))).withColumn(
            "kind", F.when(kept, F.col("kind")).otherwise(F.lit("d"))
        )
    elif acts:
        ops = ops.where(_kept(F.col("kind"), acts))
    trunc_arrays = {t: F.array(*map(_pos_struct, ps)) for t, ps in truncs.items()}
    no_truncs = F.array().cast("array<struct<lsn: bigint, seq: bigint>>")
    epoch = (
        F.size(F.filter(_by_table(trunc_arrays, no_truncs), lambda tp: tp < F.struct("lsn", "seq")))
        if truncs
        else F.lit(0)
    )
    # a column both sent and marked unchanged (not something pgoutput does) counts as sent. (In SQL: a Python
    # lambda's variable gets a new name in each plan, x_1, x_2..., which Spark writes into the generated code, so
    # that every unit's code would be new to Spark's code cache.)
    unchanged = F.when(F.size("unchanged") == 0, F.col("unchanged")).otherwise(
        F.expr("filter(unchanged, u_col -> NOT map_contains_key(coalesce(new, map()), u_col))")
    )
    ops = ops.select(
        "table",
        epoch.alias("epoch"),
        F.col("k").alias("key"),
        F.struct("lsn", "seq", "sub", "kind", "new", unchanged.alias("unchanged")).alias("op"),
    ).withColumn("h", F.xxhash64("table", "epoch", "key"))

    # 3. the fold, per (table, epoch, key): one shuffle, partitioned by a hash of the group and sorted by it first
    # (a cheap prefix sort, where sorting by the key arrays is not), then by position, so that a streaming sort
    # aggregate builds each group's list in order (see _sort_aggregate). Without TRUNCATEs the epoch is a constant
    # and stays out of the grouping (a constant grouping column would make Spark sort again).
    group = ["h", "table", "epoch", "key"] if truncs else ["h", "table", "key"]
    if single:  # one partition satisfies the grouping's distribution: Spark plans no exchange
        ops = ops.coalesce(1)
    else:
        ops = ops.repartition(_fold_partitions(n_changes, _parallelism(changes.sparkSession)), "h")
    # with moves, ``hm``: does the group hold the D of a key change that marks columns (its handoff's source)
    handoff = F.expr(handoff_op("op"))
    grouped = (
        ops.sortWithinPartitions(*group, "op.lsn", "op.seq", "op.sub")
        .groupBy(*group)
        .agg(F.collect_list("op").alias("ops"), *([F.max(handoff).alias("hm")] if moves else []))
        .select(
            "table",
            F.col("epoch") if truncs else F.lit(0).alias("epoch"),
            "key",
            F.expr(SORTED_OPS).alias("ops"),
            *(["hm"] if moves else []),
        )
    )
    trunc_pos = F.try_element_at(_by_table(trunc_arrays, no_truncs), F.greatest("epoch", F.lit(1)))
    folded = grouped.select(
        "table",
        "key",
        "ops",
        *(["hm"] if moves else []),
        _by_table({t: F.lit("D" in a) for t, a in acts.items()}, F.lit(True)).alias("si"),
        _by_table({t: F.lit("I" in a) for t, a in acts.items()}, F.lit(True)).alias("su"),
        (F.col("epoch") > 0).alias("e"),
        (F.col("epoch") == _by_table({t: F.lit(len(ps)) for t, ps in truncs.items()}, F.lit(0))).alias("last_epoch"),
        (trunc_pos if truncs else F.lit(None).cast("struct<lsn: bigint, seq: bigint>")).alias("tpos"),
        *(
            [
                _by_table({t: F.lit(True) for t in bags}, F.lit(False)).alias("bag"),
                _by_table(
                    {t: F.array(*[F.lit(c) for c in cols]) for t, cols in bags.items()},
                    F.lit(None).cast("array<string>"),
                ).alias("names"),
            ]
            if bags
            else []
        ),
    ).select("*", F.col("tpos.lsn").alias("tlsn"), F.col("tpos.seq").alias("tseq"))
    # the steps as one projection whose expressions name the columns of the steps before them (lateral column
    # aliases): analysed once, where a withColumn per step analysed the growing plan again each time
    steps = fold_steps(moves, bool(bags))
    taken = set(folded.columns)
    if taken.isdisjoint(name for name, _ in steps):
        folded = folded.selectExpr("*", *[f"{sql} AS {name}" for name, sql in steps])
    else:  # a step replaces an input column (the moves form replaces ops)
        for name, sql in steps:
            folded = folded.withColumn(name, F.expr(sql))
    # inline_outer, not inline: with inline the optimizer infers a size(rows) > 0 filter and inlines the whole fold
    # into it, many times over
    extra = ["moved_from", "plsn", "pseq"] if moves else [F.lit(None).cast("array<string>").alias("moved_from")]
    net_all = (
        folded.select("table", "key", "err", F.inline_outer("rows"))
        .where(F.col("kind").isNotNull())
        .select("table", "kind", "key", "new", "unchanged", "lsn", "seq", *extra, "err")
    )
    return _Plan([t for _, t in first_seen], truncs, n_changes, last, net_all, moves)


def _needs_handoff() -> Column:
    """Is a first pass's row an I that takes values from its key change's handoff (step 5 of the module's notes)."""
    from pyspark.sql import functions as F

    return F.coalesce((F.col("kind") == "I") & F.col("plsn").isNotNull() & (F.size("unchanged") > 0), F.lit(False))


def _final() -> Column:
    """Is a first pass's row a net row as it stands (D, U or I that takes nothing from a handoff): the partition
    value ``_MOVES_PART`` gives it (``n``; ``p`` for the H, E and I rows the second pass reads)."""
    from pyspark.sql import functions as F

    return F.when(F.col("kind").isin("D", "U", "I") & ~_needs_handoff(), F.lit("n")).otherwise(F.lit("p"))


def _resolve_moves(first: DataFrame) -> DataFrame:
    """The net rows (NET_DDL) that a first pass's H rows complete: ``first`` holds the H rows and the I rows that
    need them, and any other rows (see step 5 of the module's notes)."""
    from pyspark.sql import functions as F

    no_vals = F.create_map().cast("map<string,string>")
    hand = first.where(F.col("kind") == "H").select(
        "table",
        "lsn",
        "seq",
        F.col("new").alias("vals"),
        F.col("unchanged").alias("rest"),
        F.col("moved_from").alias("src"),
        "plsn",
        "pseq",
    )
    links = hand.select(*[F.col(c).alias(f"l_{c}") for c in hand.columns])
    limit = 1 + int(hand.count())
    pending = F.col("plsn").isNotNull() & (F.size("rest") > 0)
    on = (F.col("table") == F.col("l_table")) & (F.col("plsn") == F.col("l_lsn")) & (F.col("pseq") == F.col("l_seq"))
    lv = F.coalesce(F.col("l_vals"), no_vals)
    for _ in range(limit):  # one more link of the chains per round
        if hand.where(pending).limit(1).count() == 0:
            break
        hand = hand.join(links, on, "left").select(
            "table",
            "lsn",
            "seq",
            F.when(pending, F.map_concat("vals", F.map_filter(lv, lambda k, _v: F.array_contains("rest", k))))
            .otherwise(F.col("vals"))
            .alias("vals"),
            F.when(pending, F.filter("rest", lambda c: ~F.map_contains_key(lv, c)))
            .otherwise(F.col("rest"))
            .alias("rest"),
            F.when(pending, F.col("l_src")).otherwise(F.col("src")).alias("src"),
            F.when(pending, F.col("l_plsn")).otherwise(F.col("plsn")).alias("plsn"),
            F.when(pending, F.col("l_pseq")).otherwise(F.col("pseq")).alias("pseq"),
        )
    net = first.where(F.col("kind").isin("D", "U", "I"))
    needs = _needs_handoff()
    found = hand.select(
        F.col("table").alias("h_table"),
        F.col("lsn").alias("h_lsn"),
        F.col("seq").alias("h_seq"),
        F.col("vals").alias("h_vals"),
        F.col("src").alias("h_src"),
    )
    hv = F.coalesce(F.col("h_vals"), no_vals)
    left = F.filter("unchanged", lambda c: ~F.map_contains_key(hv, c))
    filled = (
        net.where(needs)
        .join(
            found,
            (F.col("table") == F.col("h_table"))
            & (F.col("plsn") == F.col("h_lsn"))
            & (F.col("pseq") == F.col("h_seq")),
            "left",
        )
        .select(
            "table",
            "kind",
            "key",
            F.map_concat("new", F.map_filter(hv, lambda k, _v: F.array_contains("unchanged", k))).alias("new"),
            left.alias("unchanged"),
            "lsn",
            "seq",
            F.when(F.size(left) > 0, F.col("h_src")).alias("moved_from"),
        )
    )
    rest = net.where(~needs).select("table", "kind", "key", "new", "unchanged", "lsn", "seq", "moved_from")
    return rest.unionByName(filled)


def _errors(net_all: DataFrame, limit: int) -> list[InvalidSequenceError]:
    from pyspark.sql import functions as F

    rows = (
        net_all.where(F.col("kind") == "E")
        .orderBy("err.second_lsn", "err.second_seq", "err.second_sub", "table")
        .limit(limit)
        .collect()
    )
    return [error_of(r) for r in rows]


def error_of(r: Any) -> InvalidSequenceError:
    """The error an E row (``table``, ``key``, ``err``; a Row or a dict) stands for."""
    e = r["err"]
    return InvalidSequenceError(
        r["table"],
        tuple(r["key"]),
        e["first_op"],
        Position(e["first_lsn"], e["first_seq"]),
        e["second_op"],
        Position(e["second_lsn"], e["second_seq"]),
    )


def compile_changes(
    changes: DataFrame,
    *,
    actions: Actions | None = None,
    start: Position | None = None,
    end: Position | None = None,
    out: str | None = None,
    stats: Stats | None = None,
    bags: Bags | None = None,
    to_driver: bool = False,
    in_range: bool = False,
) -> NetBatch:
    """Compile the changes (log row layout, :data:`mirrorline.log.rows.SPARK_DDL`) of one unit of work.

    ``start`` (exclusive) and ``end`` (inclusive) bound the unit when given; ``in_range``: ``changes`` hold only
    the unit's rows already (:func:`~mirrorline.log.spark.read_spark` filters a unit that ends inside a segment), so
    they are not filtered again: the plan then holds no literal of the unit's, and Spark reuses its generated classes,
    JIT-compiled, from unit to unit. ``actions`` maps tables to the kinds
    they replicate (default all). Raises :class:`InvalidSequenceError` for the earliest invalid op sequence.
    ``stats``: the log's statistics of exactly these changes (:meth:`mirrorline.log.ChangeLog.stats` over the same
    range, restricted to the same tables); they replace the job that would otherwise compute the tables' metadata.
    ``bags``: the tables without a key (:attr:`~mirrorline.model.TableSchema.bag`) and their columns.

    The net rows are computed once and written as Parquet to ``out`` (any path or URL Spark writes to; it then holds
    exactly the batch's ``net``, in the :data:`~mirrorline.compile.batch.NET_DDL` layout) or, without ``out``, to a
    scratch folder that ``NetBatch.release()`` removes. Writing Parquet costs less than Spark's cache for these
    nested rows, and keeps big units out of the JVM's memory.

    ``to_driver`` (without ``out``): bring the net rows to the driver through Arrow instead, in the same job (the
    batch's ``rows``): no Parquet written and read back, for a unit whose net rows apply would bring to the driver
    anyway. Units with key changes that leave columns unsent (their second pass reads the first's Parquet), and
    net rows larger than ``spark.driver.maxResultSize`` lets the driver collect, are written as Parquet all the same.
    """
    spark = changes.sparkSession
    plan = _plan(changes, actions, None if in_range else start, None if in_range else end, stats, bags=bags)
    if to_driver and out is None and not plan.moves:
        collected = _collected(plan, start, end)
        if collected is not None:
            return collected
    scratch = None
    if out is None:
        scratch = out = scratch_dir("net-")
    first = scratch_dir("moves-") if plan.moves else out
    try:
        # the write also counts the E rows (an observed metric: no second job), so that reading them back is only
        # needed when there are some
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        seen = Observation("mirrorline_compile")
        # in the moves form, a partition of the rows final as they are and one of those the second pass reads
        parted = plan.net_all.withColumn(_MOVES_PART, _final()) if plan.moves else plan.net_all
        counted = parted.observe(
            seen,
            F.count_if(F.col("kind") == "E").alias("errors"),
            F.count_if(F.col("kind").isin("D", "U", "I")).alias("net"),
            *([F.count_if(F.col(_MOVES_PART) == "n").alias("final")] if plan.moves else []),
        )
        with _sort_aggregate(spark):
            if plan.moves:  # (two writers a task, so that Spark does not sort the rows by their partition)
                with _conf(spark, "spark.sql.maxConcurrentOutputFileWriters", "2"):
                    counted.write.mode("overwrite").partitionBy(_MOVES_PART).parquet(first)
            else:
                counted.write.mode("overwrite").parquet(out)
        pending = f"{first}/{_MOVES_PART}=p" if plan.moves else out
        schema = f"{NET_DDL}, {_MOVES_DDL + ', ' if plan.moves else ''}{_ERR_DDL}"
        written = spark.read.schema(schema).parquet(pending) if not plan.moves or os.path.isdir(pending) else None
        errors = _errors(written, 1) if written is not None and seen.get.get("errors", 1) else []
        net_rows: int | None = int(seen.get.get("net", 0))
        if plan.moves and not errors:
            net_rows = _second_pass(spark, written, f"{first}/{_MOVES_PART}=n", out, int(seen.get.get("final", 0)))
    except BaseException:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        if plan.moves:
            shutil.rmtree(first, ignore_errors=True)
    if errors:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        raise errors[0]
    return NetBatch(
        start=start or ZERO,
        end=end or plan.last or start or ZERO,
        tables=plan.tables,
        net=spark.read.schema(NET_DDL).parquet(out),
        truncated={t: ps[-1] for t, ps in plan.truncs.items()},
        changes=plan.changes,
        scratch=scratch,
        net_rows=net_rows,
    )


def _second_pass(spark: Any, pending: DataFrame | None, final: str, out: str, finals: int) -> int | None:
    """Step 5's second pass: the rows that take values from handoffs (``pending``, the first pass's ``p`` part, None
    when it has no rows) completed and written to ``out``, and the first pass's final rows (its ``n`` part, ``finals``
    rows) moved there as they are, not read and written again. Returns how many net rows ``out`` holds (None when not
    counted)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    done = _resolve_moves(pending) if pending is not None else spark.createDataFrame([], NET_DDL)
    url = urlparse(out)
    if url.scheme not in ("", "file"):  # a store this process cannot rename into: the final rows written again
        if os.path.isdir(final):
            done = done.unionByName(spark.read.schema(NET_DDL).parquet(final).select(*done.columns))
        done.write.mode("overwrite").parquet(out)
        return None
    seen = Observation("mirrorline_moves")
    done.observe(seen, F.count(F.lit(1)).alias("n")).write.mode("overwrite").parquet(out)
    if os.path.isdir(final):
        target = url.path if url.scheme else out
        for name in os.listdir(final):
            if name.endswith((".parquet", ".parquet.crc")):
                shutil.move(os.path.join(final, name), os.path.join(target, name))  # (a rename on one device)
    return int(seen.get.get("n", 0)) + finals


def _collected(plan: _Plan, start: Position | None, end: Position | None) -> NetBatch | None:
    """The plan's net rows brought to the driver through Arrow (one job, no Parquet round trip); the earliest E
    row, if any, raised. None when they are more than Spark lets the driver collect (``spark.driver.maxResultSize``):
    the caller compiles the unit through Parquet instead."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        with _sort_aggregate(plan.net_all.sparkSession):
            rows = plan.net_all.toArrow()
    except Exception as e:
        if _RESULT_LIMIT not in str(e):
            raise
        log.warning(
            "a unit's net rows exceed %s: compiled through Parquet instead (raise it under [spark] conf to keep "
            "units of this size on the driver)",
            _RESULT_LIMIT,
        )
        return None
    assert isinstance(rows, pa.Table)
    bad = rows.filter(pc.equal(rows["kind"], "E"))
    if bad.num_rows:
        err = bad.column("err").combine_chunks()
        order = pc.sort_indices(
            pa.table(
                {
                    "l": err.field("second_lsn"),
                    "s": err.field("second_seq"),
                    "b": err.field("second_sub"),
                    "t": bad.column("table"),
                }
            ),
            sort_keys=[("l", "ascending"), ("s", "ascending"), ("b", "ascending"), ("t", "ascending")],
        )
        raise error_of(bad.take(order.slice(0, 1)).to_pylist()[0])
    net = rows.filter(pc.is_in(rows["kind"], pa.array(["D", "U", "I"]))).select(list(NET_ARROW.names))
    return NetBatch(
        start=start or ZERO,
        end=end or plan.last or start or ZERO,
        tables=plan.tables,
        rows=net.cast(NET_ARROW),
        truncated={t: ps[-1] for t, ps in plan.truncs.items()},
        changes=plan.changes,
        net_rows=net.num_rows,
    )
