"""The driver route: a unit folded on the driver in plain Python, by the rules' own code
(:func:`mirrorline.compile.reference.fold`), while Spark starts and warms up. The first changes after ``run`` starts
need not wait for the JVM: a unit of at most ``limits.FOLD_UNIT`` changes taken before the warm-up ends is read from
the log on the driver, folded, and handed to apply as Arrow rows in the NetBatch layout; once Spark is warm the
Spark routes take every unit (bench/live's restart phase measures the first change after a start).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import pyarrow as pa

from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.compile.reference import Actions, Bags, NetResult, fold
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.log.reader import ChangeLog


def net_rows(result: NetResult) -> pa.Table:
    """A fold's net rows in the NetBatch layout (a bag table's row repeated for each copy)."""
    cols: dict[str, list[object]] = {n: [] for n in NET_ARROW.names}
    for table in result.tables:
        net = result.nets.get(table)
        if net is None:
            continue
        for kind in "DUI":
            for r in sorted(net.of(kind).values(), key=lambda r: r.pos):
                for _ in range(max(r.count, 1)):
                    cols["table"].append(table)
                    cols["kind"].append(kind)
                    cols["key"].append(list(r.key))
                    cols["new"].append(list(r.new.items()) if r.new is not None else None)
                    cols["unchanged"].append(sorted(r.unchanged))
                    cols["lsn"].append(r.pos.lsn)
                    cols["seq"].append(r.pos.seq)
                    cols["moved_from"].append(list(r.moved_from) if r.moved_from is not None else None)
    return pa.table(cols, schema=NET_ARROW)


def fold_unit(
    log: ChangeLog,
    start: Position,
    end: Position,
    tables: Collection[str],
    actions: Actions,
    bags: Bags,
    changes: int,
) -> NetBatch:
    """The unit ``(start, end]`` of the configured ``tables`` (empty: all) folded on the driver. Raises
    :class:`~mirrorline.errors.InvalidSequenceError` for an invalid sequence, as every route does."""
    wanted = set(tables)
    result = fold(
        (c for c in log.read(start, end) if not wanted or c.table in wanted), actions or None, dict(bags) or None
    )
    return NetBatch(
        start=start,
        end=end,
        tables=list(result.tables),
        rows=net_rows(result),
        truncated=dict(result.truncated),
        changes=changes,
    )
