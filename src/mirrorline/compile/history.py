"""History mode's compile: a unit's changes of one table -> the versions of its rows, one per committed source
transaction that changed the key (not per unit, as the net-change fold gives). Pure; the rules:

- **Per transaction, the last image.** Inside one transaction the changes of a key fold as the net-change rules
  fold them (an insert then updates is the last image, an insert then a delete is nothing); what counts is the state
  after the transaction: the row is there (with its image) or not.
- **A version** is a state in which the row is there: it starts at the transaction that made it (commit position,
  commit time) and ends at the next transaction that changed the key (its position and time); ``deleted`` says that
  the row was not there after that transaction (a delete, a TRUNCATE, a key change away). The last version of a key in
  the unit stays open (its end none).
- **The target's open version** of a key the unit changes (one that existed before the unit: its first change there
  is an update or a delete) is closed at the key's first transaction in the unit: :attr:`History.closes`.
- **A key change** closes the old key's version (deleted: the row is not there under that key any more) and opens
  the new key's.
- **TRUNCATE** closes every version open at it (deleted): those of the unit here, the target's by
  :attr:`History.truncated` (the first TRUNCATE's position and time), applied after the closes of the keys changed
  before it.
- **Unsent columns** (TOASTed values an update did not send) take the value the key's row had in the unit; those the
  unit never saw are named in the version's ``unchanged`` and taken from the target's open version of ``source`` (the
  key itself, or the old key of a key change) before anything of the unit is written.

:func:`versions` gives them; apply writes them set-based (``apply/history.py``). Tests compare them with a reference
of their own, for generated histories (``tests/compile/test_history.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from mirrorline.errors import InvalidSequenceError
from mirrorline.model import Change, Key, Op, Value
from mirrorline.position import Position


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a key's row that the unit opens."""

    key: Key
    image: dict[str, Value]  # every column but those in ``unchanged``
    unchanged: frozenset[str]  # columns to take from the target's open version of ``source``
    source: Key | None  # the key whose open version at the target holds them (None when ``unchanged`` is empty)
    start: Position  # the transaction that made it: (commit lsn, the position of its last change of the key)
    start_ts: int  # commit time, microseconds since the Unix epoch
    end: int | None = None  # commit lsn of the transaction that ended it (None: open)
    end_ts: int | None = None
    deleted: bool = False  # the row was not there after that transaction


@dataclass(frozen=True, slots=True)
class Close:
    """The target's open version of ``key`` ends at the unit's first transaction that changed it."""

    key: Key
    end: int
    end_ts: int
    deleted: bool
    pos: Position


@dataclass(frozen=True, slots=True)
class Final:
    """A key's row after the unit (what soft deletes keep): there or not; its last image in the unit (None: the
    unit never had the row, only deleted it), and when it went."""

    key: Key
    there: bool
    image: dict[str, Value] | None
    unchanged: frozenset[str]
    source: Key | None
    pos: Position  # the key's last change in the unit
    gone: int | None = None  # not there: the commit lsn and time of the transaction that deleted it
    gone_ts: int | None = None


@dataclass
class History:
    """One table's versions from one unit, and each key's row after it."""

    closes: list[Close] = field(default_factory=list)
    versions: list[Version] = field(default_factory=list)
    truncated: tuple[int, int] | None = None  # the unit's first TRUNCATE: (commit lsn, commit time)
    finals: list[Final] = field(default_factory=list)


@dataclass(slots=True)
class _State:
    """A key's row after one transaction."""

    lsn: int
    ts: int
    pos: Position  # the last change of the key in the transaction
    image: dict[str, Value] | None  # None: not there
    unchanged: set[str]
    source: Key | None


@dataclass(slots=True)
class _Key:
    existed: bool  # the row was there before the unit (its first change is an update or a delete)
    first: Position
    states: list[_State] = field(default_factory=list)
    op: str = ""  # the last op on it, for the sequence checks
    op_pos: Position = field(default_factory=lambda: Position(0, 0))


def versions(changes: Iterable[Change], table: str) -> History:
    """The versions of ``table``'s rows the unit's ``changes`` (in log order) make, and the target's versions they
    close. Raises :class:`InvalidSequenceError` for a sequence the net-change rules refuse (an insert of a key that
    is there, an update or delete of one that is not)."""
    keys: dict[Key, _Key] = {}
    out = History()
    truncs: list[tuple[Position, int]] = []

    def state(k: Key, c: Change, existed: bool) -> tuple[_Key, _State | None]:
        """The key's record and its state before ``c`` (None: its first change in the unit)."""
        rec = keys.get(k)
        if rec is None:
            rec = keys[k] = _Key(existed, c.pos)
        return rec, (rec.states[-1] if rec.states else None)

    def put(rec: _Key, c: Change, image: dict[str, Value] | None, unchanged: set[str], source: Key | None) -> None:
        last = rec.states[-1] if rec.states else None
        if last is not None and last.lsn == c.pos.lsn:
            last.image, last.unchanged, last.source, last.pos = image, unchanged, source, c.pos
        else:
            rec.states.append(_State(c.pos.lsn, c.commit_ts, c.pos, image, unchanged, source))

    def there(rec: _Key, prev: _State | None) -> bool:
        return prev.image is not None if prev is not None else rec.existed

    def check(rec: _Key, k: Key, op: str, c: Change, ok: bool) -> None:
        if not ok:
            raise InvalidSequenceError(table, k, rec.op or "(before the unit)", rec.op_pos, op, c.pos)
        rec.op, rec.op_pos = op, c.pos

    def delete(k: Key, c: Change) -> tuple[dict[str, Value] | None, set[str], Key | None]:
        """The row of ``k`` goes (a delete, or a key change away): its image, unsent columns and their source."""
        rec, prev = state(k, c, existed=True)
        check(rec, k, "D", c, there(rec, prev))
        if prev is None:
            image: dict[str, Value] | None = {}
            unchanged: set[str] | None = None  # every column: the target's row
            source: Key | None = k
        else:
            image, unchanged, source = prev.image, prev.unchanged, prev.source
        put(rec, c, None, set(), None)
        return image, (unchanged if unchanged is not None else {"*"}), source

    def image_of(
        c: Change, base: dict[str, Value] | None, base_unchanged: set[str], base_source: Key | None
    ) -> tuple[dict[str, Value], set[str], Key | None]:
        new = dict(c.new or {})
        left: set[str] = set()
        for col in c.unchanged:
            if col in new:
                continue
            if base is not None and col in base:
                new[col] = base[col]
            else:
                left.add(col)
        return new, left, (base_source if left else None)

    for c in changes:
        if c.table != table:
            continue
        if c.op == Op.TRUNCATE:
            truncs.append((c.pos, c.commit_ts))
            for rec in keys.values():
                last = rec.states[-1] if rec.states else None
                if last is not None and last.image is not None:
                    put(rec, c, None, set(), None)
                    rec.op, rec.op_pos = "T", c.pos
            continue
        if c.op == Op.DELETE:
            delete(c.key, c)
            continue
        if c.op == Op.UPDATE and c.old_key is not None and tuple(c.old_key) != tuple(c.key):
            old_image, old_left, old_source = delete(tuple(c.old_key), c)
            rec, prev = state(c.key, c, existed=False)
            check(rec, c.key, "I", c, not there(rec, prev))
            if "*" in old_left:  # the old key's row as the target holds it
                image, left, source = image_of(c, {}, set(), None)
                source = tuple(c.old_key) if left else None
            else:
                image, left, source = image_of(c, old_image, old_left, old_source)
            put(rec, c, image, left, source)
            continue
        if c.op == Op.INSERT:
            rec, prev = state(c.key, c, existed=False)
            check(rec, c.key, "I", c, not there(rec, prev))
            image, left, _ = image_of(c, None, set(), None)
            put(rec, c, image, left, None)
            continue
        # an update of the key's row
        rec, prev = state(c.key, c, existed=True)
        check(rec, c.key, "U", c, there(rec, prev))
        if prev is None:
            image, left, source = image_of(c, None, set(), c.key)
        else:
            image, left, source = image_of(c, prev.image, prev.unchanged, prev.source)
        put(rec, c, image, left, source)

    if truncs:
        out.truncated = (truncs[0][0].lsn, truncs[0][1])
    first_trunc = truncs[0][0] if truncs else None
    for k, rec in keys.items():
        states = rec.states
        if rec.existed and (first_trunc is None or rec.first < first_trunc):
            s0 = states[0]
            out.closes.append(Close(k, s0.lsn, s0.ts, s0.image is None, s0.pos))
        last, seen = states[-1], None
        for st in reversed(states):
            if st.image is not None:
                seen = st
                break
        if seen is not None or rec.existed:  # (else the row was never there at a commit: nothing to keep)
            out.finals.append(
                Final(
                    key=k,
                    there=last.image is not None,
                    image=seen.image if seen is not None else None,
                    unchanged=frozenset(seen.unchanged) if seen is not None else frozenset(),
                    source=seen.source if seen is not None and seen.unchanged else None,
                    pos=last.pos,
                    gone=last.lsn if last.image is None else None,
                    gone_ts=last.ts if last.image is None else None,
                )
            )
        for i, st in enumerate(states):
            if st.image is None:
                continue
            nxt = states[i + 1] if i + 1 < len(states) else None
            out.versions.append(
                Version(
                    key=k,
                    image=st.image,
                    unchanged=frozenset(st.unchanged),
                    source=st.source if st.unchanged else None,
                    start=st.pos,
                    start_ts=st.ts,
                    end=nxt.lsn if nxt is not None else None,
                    end_ts=nxt.ts if nxt is not None else None,
                    deleted=nxt is not None and nxt.image is None,
                )
            )
    return out


def pg_text_time(us: int | None) -> str | None:
    """Microseconds since the Unix epoch -> PostgreSQL's text of a timestamp with time zone, in UTC (as
    :func:`frames` writes it)."""
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00")


# -- the same, set-based -------------------------------------------------------------------------------------------


@dataclass
class Frames:
    """One table's versions from one unit, set-based (:func:`frames`): flat text columns, ready for apply's
    worktables. ``versions``: ``k0..kN`` (the key), the table's :attr:`columns` as ``c0..cN`` (NULL where unsent),
    ``unsent`` (a list: the columns to take from the target's current version of ``m0..mN``), ``m0..mN``,
    ``lsn``/``seq`` (the position of the version's last change), ``start_lsn``, ``start_at``, ``end_lsn``, ``end_at``,
    ``deleted``; ``closes``: ``k0..kN``, ``end_lsn``, ``end_at``, ``deleted``, ``lsn``, ``seq``. Times as
    PostgreSQL's text in UTC, LSNs as decimal text, ``deleted`` as ``t``/``f``."""

    versions: pa.Table
    closes: pa.Table
    columns: tuple[str, ...] = ()  # the table's columns, in the versions as c0..cN


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def frames(rows: pa.Table, table: str, columns: Sequence[str], nkey: int) -> Frames | None:
    """:func:`versions` of ``table`` (its ``columns``, a key of ``nkey`` columns) from the unit's changes ``rows``
    (the log's layout, in log order) by DuckDB's set-based SQL: the same versions, as flat columns
    (:class:`Frames`). None where the plain fold must do it: a TRUNCATE of the table in the unit, or a key change
    leaving columns unsent. The images are read out of their maps by pyarrow first (DuckDB's import of a map column
    costs more than all the rest: bench/apply.py --history)."""
    import duckdb
    import numpy as np
    import pyarrow.compute as pc

    from mirrorline.log.columns import image_columns

    mine = pc.equal(rows["table"], table)
    if pc.all(mine).as_py() is not True:  # (a copy of every column, the images too: only where others are there)
        rows = rows.filter(mine)
    n = rows.num_rows
    ops = rows["op"]
    if pc.any(pc.equal(ops, "T")).as_py():
        return None
    has_old = pc.fill_null(pc.equal(pc.list_value_length(rows["old_key"]), nkey), False)
    old_keys = pc.if_else(has_old, rows["old_key"], rows["key"])  # (no old key: the key itself, unused)
    keys = [pc.list_element(rows["key"], i) for i in range(nkey)] if n else [pa.nulls(0, pa.string())] * nkey
    olds = [pc.list_element(old_keys, i) for i in range(nkey)] if n else [pa.nulls(0, pa.string())] * nkey

    def joined(parts: list[Any]) -> Any:
        if nkey == 1:
            return parts[0]
        return pc.binary_join_element_wise(*parts, "\x1f", null_handling="replace", null_replacement="\\N")

    kk, okk = joined(keys), joined(olds)
    moved = pc.and_(pc.and_(pc.equal(ops, "U"), has_old), pc.fill_null(pc.not_equal(kk, okk), False))
    lengths = pc.fill_null(pc.list_value_length(rows["unchanged"]), 0)
    unsent = bool(n) and bool(pc.any(pc.greater(lengths, 0)).as_py())
    if unsent and pc.any(pc.and_(moved, pc.greater(lengths, 0))).as_py():
        return None
    flat: dict[str, Any] = {
        "rid": pa.array(np.arange(n, dtype=np.int64)),
        "lsn": rows["lsn"],
        "seq": rows["seq"],
        "ts": rows["ts"],
        "op": ops,
        "moved": moved,
        "kk": kk,
        "okk": okk,
        **{f"k{i}": k for i, k in enumerate(keys)},
        **{f"o{i}": k for i, k in enumerate(olds)},
    }
    values = image_columns(rows["new"], columns) if n else {c: pa.nulls(0, pa.string()) for c in columns}
    flat.update({f"c{i}": values[c] for i, c in enumerate(columns)})
    if unsent:  # per column, was it sent (not named unchanged)
        parent = pc.list_parent_indices(rows["unchanged"]).to_numpy()
        names = pc.list_flatten(rows["unchanged"])
        for i, c in enumerate(columns):
            sent = np.ones(n, dtype=bool)
            sent[parent[pc.equal(names, c).to_numpy(zero_copy_only=False)]] = False
            flat[f"s{i}"] = pa.array(sent)
    con = duckdb.connect()
    try:
        con.register("unit", pa.table(flat))
        key_of = ", ".join(f"k{i}" for i in range(nkey))
        # the key's changes (a key change: a delete of its old key, then an insert of its new one)
        con.execute(
            f"""
            CREATE TEMP TABLE ops AS
            SELECT rid, lsn, seq, ts, 0 AS sub, CASE WHEN moved THEN 'D' ELSE op END AS kind,
                   CASE WHEN moved THEN okk ELSE kk END AS kk,
                   {", ".join(f"CASE WHEN moved THEN o{i} ELSE k{i} END AS k{i}" for i in range(nkey))}
            FROM unit
            UNION ALL
            SELECT rid, lsn, seq, ts, 1, 'I', kk, {key_of} FROM unit WHERE moved
            """
        )
        if unsent:  # each column's value: the last one sent before, in the key's order
            filled = ", ".join(
                f"last_value(CASE WHEN o.kind <> 'D' AND u.s{i} THEN {{'v': u.c{i}}} END IGNORE NULLS) OVER w AS f{i}"
                for i in range(len(columns))
            )
            con.execute(
                f"CREATE TEMP TABLE vals AS SELECT o.rid, o.sub, {filled} FROM ops o JOIN unit u ON u.rid = o.rid "
                "WINDOW w AS (PARTITION BY o.kk ORDER BY o.lsn, o.seq, o.sub ROWS UNBOUNDED PRECEDING)"
            )
            source = "vals v ON v.rid = st.rid AND v.sub = st.sub"
            picked = ", ".join(f"v.f{i} AS f{i}" for i in range(len(columns)))
        else:  # every change sends every column: the last change's
            source = "unit v ON v.rid = st.rid"
            picked = ", ".join(
                f"CASE WHEN st.kind <> 'D' THEN {{'v': v.c{i}}} END AS f{i}" for i in range(len(columns))
            )
        # per key and transaction its last change (and per key its first); per key, the transaction after each
        con.execute(
            f"""
            CREATE TEMP TABLE st AS
            WITH last AS (
                SELECT kk, lsn, max(rid * 2 + sub) AS at FROM ops GROUP BY kk, lsn
            ), first AS (
                SELECT kk, arg_min(kind, rid * 2 + sub) AS first_kind FROM ops GROUP BY kk
            ), states AS (
                SELECT o.*, f.first_kind FROM last l JOIN ops o ON o.rid * 2 + o.sub = l.at JOIN first f
                ON f.kk = l.kk
            ), chained AS (
                SELECT *, lead(lsn) OVER p AS next_lsn, lead(ts) OVER p AS next_ts, lead(kind) OVER p AS next_kind,
                       row_number() OVER p AS nth
                FROM states WINDOW p AS (PARTITION BY kk ORDER BY lsn)
            )
            SELECT st.*, {picked} FROM chained st LEFT JOIN {source}
            """
        )

        def at(col: str) -> str:
            text = f"strftime(make_timestamp({col}), '%Y-%m-%d %H:%M:%S.%f') || '+00'"
            return f"CASE WHEN {col} IS NULL THEN NULL ELSE {text} END"

        keys_out = ", ".join(f"k{i}" for i in range(nkey))
        values_out = ", ".join(f"f{i}.v AS c{i}" for i in range(len(columns)))
        unsent_list = (
            "list_filter(["
            + ", ".join(f"CASE WHEN f{i} IS NULL THEN {_lit(c)} END" for i, c in enumerate(columns))
            + "], lambda x: x IS NOT NULL)"
        )
        moved_out = ", ".join(f"CASE WHEN len({unsent_list}) > 0 THEN k{i} END AS m{i}" for i in range(nkey))
        versions = con.sql(
            f"SELECT {keys_out}, {values_out}, {unsent_list} AS unsent, {moved_out}, "
            f"CAST(lsn AS VARCHAR) AS lsn, CAST(seq AS VARCHAR) AS seq, CAST(lsn AS VARCHAR) AS start_lsn, "
            f"{at('ts')} AS start_at, CAST(next_lsn AS VARCHAR) AS end_lsn, {at('next_ts')} AS end_at, "
            f"CASE WHEN next_kind = 'D' THEN 't' ELSE 'f' END AS deleted "
            f"FROM st WHERE kind <> 'D'"
        ).to_arrow_table()
        closes = con.sql(
            f"SELECT {keys_out}, CAST(lsn AS VARCHAR) AS end_lsn, {at('ts')} AS end_at, "
            f"CASE WHEN kind = 'D' THEN 't' ELSE 'f' END AS deleted, CAST(lsn AS VARCHAR) AS lsn, "
            f"CAST(seq AS VARCHAR) AS seq FROM st WHERE nth = 1 AND first_kind IN ('U', 'D')"
        ).to_arrow_table()
    finally:
        con.close()
    return Frames(versions, closes, tuple(columns))
