"""Apply's failure path: when a unit's set-based statements fail on the data (a value the target refuses, a
constraint, a row missing), the unit is rolled back and its changes are re-applied one by one in log order to find
the failing change. ``on_error = "stop"``: stop with an error naming it, nothing applied. ``"reject"``: set each
failing change aside in ``mirrorline_rejects`` (under a savepoint, so one pass sets any number aside; an engine
without savepoints runs the pass again after each) and commit the rest with the unit's position.

The changes re-applied are those the bulk path folded (:func:`mirrorline.compile.reference.kept_changes`: the same
per-table actions).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from mirrorline.apply.session import RowMissing, Session
from mirrorline.apply.sql import MASK_COL, MASK_SEP, key_col, moved_col
from mirrorline.apply.state import now as now_stamp
from mirrorline.compile.reference import marks
from mirrorline.errors import ApplyError, TransientTargetError
from mirrorline.model import Change, Op, TableSchema

if TYPE_CHECKING:
    from mirrorline.apply.target import Target
    from mirrorline.apply.target import UnitWork as Unit

_images = itertools.count(1)


def reapply(
    target: Target,
    s: Session,
    u: Unit,
    tables: list[str],
    unit: bool,
    whole: Callable[[Session], None] | None = None,
    serial: Collection[str] | None = None,
) -> int:
    """Re-apply the tables' changes one by one in log order. Stop: the first failing change is an ApplyError
    (nothing applied). Reject: each failing change is set aside (rolled back to a savepoint taken before it; on
    an engine without savepoints the pass restarts without it); the passing changes, the rejects and the position
    commit together. Returns the number of rejects. ``serial``: the tables re-applied so (default: all); the others
    are written by ``whole`` in the same transaction, after them (tables kept with their history, which have no
    change-by-change path: what fails there is theirs)."""
    scope, schemas, state, end = set(tables if serial is None else serial), u.schemas, u.state, u.batch.end
    src = u.changes() if callable(u.changes) else u.changes
    todo = [c for c in (src or ()) if c.table in scope and state.table(c.table) < c.pos <= end]
    rejected: dict[int, str] = {}
    guarded = target.on_error == "reject" and s.savepoints
    while True:
        failed: tuple[int, Change, str] | None = None
        s.begin()
        try:
            for i, c in enumerate(todo):
                if i in rejected:
                    continue
                if guarded:
                    s.execute("SAVEPOINT mirrorline_change")
                try:
                    _apply_change(target, s, schemas[c.table], c)
                except Exception as e:
                    if not (isinstance(e, RowMissing) or s.is_data_error(e)):
                        raise
                    if guarded:
                        rejected[i] = s.error_text(e)
                        s.execute("ROLLBACK TO SAVEPOINT mirrorline_change")
                        continue
                    failed = (i, c, s.error_text(e))
                    break
                if guarded:
                    s.execute("RELEASE SAVEPOINT mirrorline_change")
            if failed is None:
                if whole is not None:
                    whole(s)
                now = now_stamp()
                for i, msg in sorted(rejected.items()):
                    c = todo[i]
                    s.execute(
                        target.dialect.insert_reject(),
                        (
                            c.pos.lsn,
                            c.pos.seq,
                            str(c.pos),
                            c.table,
                            json.dumps(list(c.key)),
                            c.op.value,
                            json.dumps(dict(c.new)) if c.new is not None else None,
                            msg,
                            now,
                        ),
                    )
                u.record(s, tables, unit)
                s.commit()
                return len(rejected)
        except Exception as e:
            with contextlib.suppress(Exception):
                s.rollback()
            if not isinstance(e, s.db_errors):
                raise
            raise TransientTargetError(
                f"target {target.name}: re-applying the unit serially failed: {s.error_text(e)}",
                hint="nothing was applied; check the target and run again",
                target=target.name,
            ) from e
        with contextlib.suppress(Exception):
            s.rollback()
        i, c, msg = failed
        if target.on_error == "stop":
            raise _change_error(target, c, msg)
        rejected[i] = msg


def _change_error(target: Target, c: Change, msg: str) -> ApplyError:
    what = {Op.INSERT: "insert", Op.UPDATE: "update", Op.DELETE: "delete", Op.TRUNCATE: "truncate"}[c.op]
    return ApplyError(
        f"target {target.name}: {what} on {c.table} key {list(c.key)} at {c.pos} failed: {msg}",
        hint='fix the target (or the row) and run again; or set on_error = "reject" to set failing changes aside',
        target=target.name,
        table=c.table,
        key=list(c.key),
        position=str(c.pos),
        op=c.op.value,
        db_message=msg,
    )


def _apply_change(target: Target, s: Session, ts: TableSchema, c: Change) -> None:
    d = target.dialect
    keys = [key_col(i) for i in range(len(ts.key))]
    if c.op is Op.TRUNCATE:
        s.execute(d.truncate(c.table))
        return
    if c.op is Op.DELETE:
        delete = d.bag_delete if ts.bag else d.join_delete
        if s.dml(delete(ts, d.one_row(keys)), list(c.key)) == 0:
            raise RowMissing("D")
        return
    if ts.bag:  # a table without a key: one copy of the old image goes, one of the new comes (the key: every column)
        if c.op is Op.UPDATE and c.old_key is not None and tuple(c.old_key) != tuple(c.key):
            if s.dml(d.bag_delete(ts, d.one_row(keys)), list(c.old_key)) == 0:
                raise RowMissing("U")
        elif c.op is Op.UPDATE:  # the image did not change
            return
        cols = list(ts.key)
        if s.dml(d.insert_select(ts, d.one_row(cols), cols), list(c.key)) != 1:
            raise RowMissing("I")
        return
    new = dict(c.new or {})
    if c.op is Op.INSERT:
        cols = list(ts.column_names)
        unsent = marks(c) & frozenset(cols)
        if unsent and c.old_key is not None:
            _insert_moved(target, s, ts, c, unsent)
            return
        if target.needs.keeps_deleted(ts.table):  # a row the source deleted may be kept: the insert replaces it
            s.dml(d.join_delete(ts, d.one_row(keys)), list(c.key))
        if s.dml(d.insert_select(ts, d.one_row(cols), cols), [new.get(x) for x in cols]) != 1:
            raise RowMissing("I")
        return
    # update: the old key finds the row; a key-changing update also writes the key columns
    match_key = c.old_key if c.old_key is not None else c.key
    set_cols = [x for x in ts.column_names if x in new and (x not in ts.key or c.old_key is not None)]
    if not set_cols:
        return
    params: list[Any] = list(match_key) + [new[x] for x in set_cols]
    got = s.dml(d.join_update(ts, d.one_row(keys + set_cols), set_cols, None), params)
    if got == 0:
        if target.mode == "mirror" and not c.unchanged and c.old_key is None:  # mirror: an update inserts
            cols = list(ts.column_names)
            s.dml(d.insert_select(ts, d.one_row(cols), cols), [new.get(x) for x in cols])
            return
        raise RowMissing("U")


def _insert_moved(target: Target, s: Session, ts: TableSchema, c: Change, unsent: frozenset[str]) -> None:
    """A key change kept only as the insert of its new key (the table's actions drop D): the columns it did not
    send are read from the old key's row, as the bulk path's moved images are."""
    d = target.dialect
    cols = list(ts.column_names)
    mask = MASK_SEP.join(sorted(unsent))
    row = d.one_row([*cols, MASK_COL, *[moved_col(i) for i in range(len(ts.key))]])
    image = f"mirrorline_serial_{next(_images)}"
    s.execute(
        d.moved_image(ts, row, image, unsent, [mask]),
        [*[c.new.get(x) if c.new else None for x in cols], mask, *(c.old_key or ())],
    )
    try:
        if int(s.query(d.count(image))[0][0]) != 1:
            raise RowMissing("M")
        if target.needs.keeps_deleted(ts.table):  # (a row of the new key the source deleted may be kept)
            s.dml(d.join_delete(ts, d.one_row([key_col(i) for i in range(len(ts.key))])), list(c.key))
        s.dml(d.insert_typed(ts, image, cols))
    finally:
        s.execute(d.drop_table(image))
