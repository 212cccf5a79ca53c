"""Units in which no key repeats: the net rows are the changes themselves.

A nightly batch job's ``UPDATE`` of every row, a purge's ``DELETE``, a backfill: one large transaction whose every
change is to a different key. Under the rules (:mod:`mirrorline.compile.reference`) the fold of a key with one
change is that change (an I, a U with the columns it leaves unsent still marked, a D), so such a unit has nothing to
fold, and the shuffle a fold needs is all cost. This route reads the unit's rows on the driver once (the log layout,
:meth:`~mirrorline.log.ChangeLog.read_arrow`), checks that each (table, key) appears once (a hash count of the keys
joined as text, in Arrow's C++), and hands the rows to apply in the :data:`~mirrorline.compile.batch.NET_ARROW`
layout. When a key repeats the route declines (None) and the next route folds the unit: what that costs is the read.

It takes a unit larger than the small route's, small enough for the driver (``limits.DRIVER_UNIT``), with no
TRUNCATE, no key change, no table without a key or replicating only some kinds of change (an insert into a table
that does not replicate deletes replaces the row: the fold says so), in which most changes are in streamed
transactions (the log's stream segments: PostgreSQL streamed them because they are large), or whose keys, by the
log's sketch of each table's keys (:class:`~mirrorline.log.stats.KeySketch`, summed from segment footers), are
about as many as its changes (at least :data:`DISTINCT_SHARE` of them, per table). Other units are left to the
routes that fold them (a catch-up of a table updated again and again repeats its keys, and the read would be
wasted). ``bench/bigtxn.py`` measures it on one transaction of 1,000,000 rows updated or deleted;
``bench/apply.py``'s ``distinct_keys`` on 1,000,000 updates of different keys in transactions of 1,000.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.compile.reference import ALL_ACTIONS, Actions, actions_of
from mirrorline.compile.small import unit_rows
from mirrorline.log.stats import Stats, key_ids
from mirrorline.position import Position

# A table's keys, by its sketch (3.3% standard error), at least this share of its changes: nothing folds, most
# likely. A unit taken wrongly costs its read (the fold that follows is the one it would have had).
DISTINCT_SHARE = 0.85


def nothing_folds(stats: Stats) -> bool:
    """Do the sketches say that every table's changes are to about as many different keys (False: unknown)?"""
    for s in stats.values():
        keys = s.distinct_keys()
        if keys is None or keys < DISTINCT_SHARE * s.count:
            return False
    return bool(stats)


def qualifies(
    stats: Stats,
    bags: Collection[str],
    streamed: Callable[[], int],
    small_unit: int,
    driver_unit: int,
    on_driver: bool = True,
    actions: Actions | None = None,
) -> bool:
    """Does the unit with these statistics (of the tables it replicates), ``streamed()`` of whose changes are in
    streamed transactions (asked last: it reads the log's segment list), qualify (see the module's docstring)?
    ``on_driver``: its net rows may stay in the driver's memory."""
    count = sum(s.count for s in stats.values())
    if not on_driver or not small_unit < count <= driver_unit:
        return False
    return all(
        not s.truncates and not s.key_changes and t not in bags and actions_of(actions, t) == ALL_ACTIONS
        for t, s in stats.items()
    ) and (nothing_folds(stats) or 2 * streamed() >= count)


def compile_distinct(
    batches: Iterable[pa.Table],
    stats: Stats,
    start: Position,
    end: Position,
    tables: Collection[str] | None = None,
) -> NetBatch | None:
    """The unit ``(start, end]`` (``batches``: its rows read on the driver, the log layout; ``stats``: their
    statistics; ``tables``: the configured tables, empty for all) as a batch of its changes as net rows, or None
    when some (table, key) has more than one change (a fold is needed)."""
    rows = unit_rows(tables, batches)
    if pc.count_distinct(_ids(rows, len(stats) > 1), mode="all").as_py() != rows.num_rows:
        return None
    n = rows.num_rows
    new, deletes = rows["new"], pc.equal(rows["op"], "D")
    if pc.any(pc.and_(deletes, pc.is_valid(new))).as_py():  # a net D carries no image (capture writes none)
        new = pc.if_else(deletes, pa.nulls(n, NET_ARROW.field("new").type), new)
    net = pa.table(
        {
            "table": rows["table"],
            "kind": rows["op"],
            "key": rows["key"],
            "new": new,
            "unchanged": rows["unchanged"],
            "lsn": rows["lsn"],
            "seq": rows["seq"],
            "moved_from": pa.nulls(n, NET_ARROW.field("moved_from").type),
        }
    ).cast(NET_ARROW)
    order = [t for _, t in sorted((min(s.first.values()), t) for t, s in stats.items())]
    return NetBatch(
        start=start,
        end=end,
        tables=order,
        rows=net,
        changes=sum(s.count for s in stats.values()),
        net_rows=n,
    )


def _ids(rows: pa.Table, tables: bool) -> pa.ChunkedArray:
    """Each row's key as one value (:func:`~mirrorline.log.stats.key_ids`; ``tables``: prefixed by its table). Two
    NULL keys count as one value: such a unit is folded, never taken wrongly."""
    ids = key_ids(rows["key"])
    if tables:
        ids = pc.binary_join_element_wise(rows["table"], ids, "\x01", null_handling="replace", null_replacement="\x02")
    return ids
