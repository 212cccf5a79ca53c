"""``mirrorline verify``: each table's row count and order-independent checksum, source against target, at the same
position.

Which position, exactly: a temporary slot with an exported snapshot gives a consistent point ``P``; the source is
read under that snapshot, i.e. exactly the changes at or before ``A = (P - 1, SEQ_MAX)``. Then the log is made to
hold everything before ``P`` (the main slot's confirmed flush reaches ``P``: capture has made every transaction
committed before ``P`` durable; when no capture runs, verify runs one to that point), and each target is brought to
exactly ``A`` by applying the log up to ``A`` (the unit ends there). The target is then read in one transaction
together with its applied position, which must be ``A``: source and target are compared at the same position, with
no quiet period needed on the source. (If another process applies to the target meanwhile and takes it past ``A``,
verify takes a new point and tries again.)

Bringing source and target to one position and reading both under it are one protocol whose steps share its
retries; what it found is :mod:`mirrorline.verify.report`'s, the checksums themselves are in ``apply/canonical.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from mirrorline import stopped
from mirrorline.apply import open_target, target_class
from mirrorline.apply.canonical import MASK, Held, checksum, combine, held, select_text
from mirrorline.apply.lock import TargetBusy
from mirrorline.apply.target import Target
from mirrorline.capture.source import connect
from mirrorline.config import Config
from mirrorline.errors import MirrorlineError
from mirrorline.log.layout import Layout
from mirrorline.log.reader import ChangeLog
from mirrorline.model import TableSchema, quote_ident
from mirrorline.pipeline import catch_up_target as catch_up
from mirrorline.pipeline.targets import schema_needs, untrusted_tables
from mirrorline.position import ZERO, Position, format_lsn, parse_lsn
from mirrorline.snapshot import ATTEMPTS, Rewritten, check_rewritten, retrying, run_tasks, tables_at, target_config
from mirrorline.snapshot import state as snapstate
from mirrorline.snapshot.plan import TableStat, plan_chunks, select_sql
from mirrorline.snapshot.source import consistent_point, require_source, snapshot_connection
from mirrorline.snapshot.tasks import rewritten
from mirrorline.verify.diff import Buckets, compare, in_buckets
from mirrorline.verify.report import TableCheck, TargetCheck, VerifyReport

FETCH = 10_000


class VerifyError(MirrorlineError):
    """verify could not compare (not a difference: a difference is exit status 1 with the tables listed)."""


# ------------------------------------------------------------------------------------------------------ source


def checksum_chunk(spec: dict[str, Any]) -> dict[str, Any]:
    """A Spark task: one chunk of one source table read under the exported snapshot, as canonical text: its count
    and checksum, once as the source holds its rows and once more for each of ``views`` (how a target holds them:
    :func:`~mirrorline.apply.canonical.held`); with ``key`` (column indexes) also their sums per key bucket; with
    ``wanted`` (buckets) instead the rows of those buckets (``verify --diff``)."""
    conn = snapshot_connection(spec["dsn"], spec["snapshot"], "mirrorline verify", utc=True)
    out: dict[str, Any] = {"table": spec["table"]}
    views: list[Held] = [()] + [tuple((int(i), str(r)) for i, r in v) for v in spec.get("views", [])]
    try:
        with conn.cursor(name="mirrorline_verify") as cur:
            cur.itersize = FETCH
            cur.execute(spec["sql"])
            key, wanted = spec.get("key"), spec.get("wanted")
            if wanted is not None:
                out["rows"] = [list(r) for r in in_buckets(cur, spec["key"], set(wanted))]
            elif key is not None or len(views) > 1:
                rows = list(cur)
                out["sums"] = [checksum(held(rows, v)) for v in views]
                if key is not None:
                    out["buckets"] = []
                    for v in views:
                        b = Buckets()
                        b.add(held(rows, v), key)
                        out["buckets"].append(b.to_json())
            else:
                out["sums"] = [checksum(cur)]
        with conn.cursor() as cur:  # same transaction, the table's lock still held: see snapshot.tasks
            out["rewritten"] = rewritten(cur, spec["table"])
    finally:
        conn.close()
    return out


def _text_select(schema: TableSchema, sql_from: str) -> str:
    cols = ", ".join(select_text(quote_ident(c.name), c.type_name) for c in schema.columns)
    return f"SELECT {cols} FROM {sql_from}"


def _key_indexes(schema: TableSchema) -> list[int]:
    names = list(schema.column_names)
    return [names.index(k) for k in schema.key] if schema.key else list(range(len(names)))


def _source_specs(
    config: Config, snapshot: str, stats: dict[str, TableStat], chunk_blocks: int
) -> list[dict[str, Any]]:
    src = require_source(config)
    specs = []
    for c in plan_chunks(stats.values(), chunk_blocks, 1):
        schema = stats[c.table].schema
        sql_from = select_sql(schema, c).split(" FROM ", 1)[1]
        specs.append({"dsn": src.dsn, "snapshot": snapshot, "table": c.table, "sql": _text_select(schema, sql_from)})
    return specs


def target_views(config: Config, names: Iterable[str], stats: dict[str, TableStat]) -> dict[str, dict[str, Held]]:
    """Per target and table, how the target holds the source's rows (empty: as they are)."""
    out: dict[str, dict[str, Held]] = {}
    for name in names:
        dialect = target_class(config.targets[name].kind).dialect
        out[name] = {}
        for t, st in stats.items():
            infos = [(i, dialect.type_info(t, c).lossy) for i, c in enumerate(st.schema.columns)]
            out[name][t] = tuple((i, n) for i, n in infos if n)
    return out


def source_checksums(
    config: Config,
    snapshot: str,
    stats: dict[str, TableStat],
    chunk_blocks: int = 16384,
    buckets: bool = False,
    views: dict[str, list[Held]] | None = None,
) -> tuple[dict[str, list[tuple[int, int]]], dict[str, list[Buckets]]]:
    """Per table (rows, checksum), and with ``buckets`` its sums per key bucket (``verify --diff``): first as the
    source holds its rows, then once for each of the table's ``views`` (how targets hold them)."""

    views = views or {}
    specs = _source_specs(config, snapshot, stats, chunk_blocks)
    for spec in specs:
        spec["views"] = [[[i, r] for i, r in v] for v in views.get(spec["table"], [])]
        if buckets:
            spec["key"] = _key_indexes(stats[spec["table"]].schema)
    n_views = {t: 1 + len(views.get(t, [])) for t in stats}
    out = {t: [(0, 0)] * n_views[t] for t in stats}
    by_bucket = {t: [Buckets() for _ in range(n_views[t])] for t in stats} if buckets else {}
    results = run_tasks(checksum_chunk, specs, f"mirrorline-verify-{os.getpid()}", "verify: reading the source")
    check_rewritten(results)
    for r in results:
        t = r["table"]
        out[t] = [combine(a, (int(b[0]), int(b[1]))) for a, b in zip(out[t], r["sums"], strict=True)]
        if buckets:
            for acc, b in zip(by_bucket[t], r["buckets"], strict=True):
                acc.merge(Buckets.from_json(b))
    return out, by_bucket


def source_rows_in(
    config: Config, snapshot: str, stats: dict[str, TableStat], wanted: dict[str, set[int]], chunk_blocks: int = 16384
) -> dict[str, list[tuple[Any, ...]]]:
    """The source rows of ``wanted`` buckets per table, read under the same snapshot."""
    sub = {t: st for t, st in stats.items() if t in wanted}
    specs = _source_specs(config, snapshot, sub, chunk_blocks)
    for spec in specs:
        spec["key"], spec["wanted"] = _key_indexes(sub[spec["table"]].schema), sorted(wanted[spec["table"]])
    out: dict[str, list[tuple[Any, ...]]] = {t: [] for t in sub}
    results = run_tasks(checksum_chunk, specs, f"mirrorline-verify-{os.getpid()}", "verify --diff: the source's rows")
    for r in results:
        if r["rewritten"]:  # TRUNCATE is not MVCC-safe: the snapshot would see the table empty
            out.pop(r["table"], None)
    for r in results:
        if r["table"] in out:
            out[r["table"]].extend(tuple(x) for x in r["rows"])
    return out


# ------------------------------------------------------------------------------------------------------ the log


def _capture_running(config: Config) -> bool:
    layout = Layout(config.log.path)
    if not layout.lock.exists():
        return False
    fd = os.open(layout.lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases a lock we took
    return False


def _confirmed(config: Config) -> int:

    src = require_source(config)
    conn = connect(src.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (src.slot,))
            row = cur.fetchone()
            return parse_lsn(row[0]) if row and row[0] else 0
    finally:
        conn.close()


def _nudge(config: Config) -> None:
    """A transaction of our own after the point, so that capture confirms past it even on an idle source."""
    conn = connect(require_source(config).dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_logical_emit_message(true, 'mirrorline', 'verify')")
    finally:
        conn.close()


def ensure_log(config: Config, point: int, wait_seconds: float = 120.0) -> None:
    """Return once the log holds every change committed before ``point``. A capture that runs (``run``,
    ``capture``) is waited for; while none does, one runs here until the source's present, and again if it stopped
    short of the point (a ``run`` stopped while it was waited for)."""
    deadline = time.monotonic() + wait_seconds
    confirmed = _confirmed(config)
    if confirmed >= point:
        return
    _nudge(config)
    while True:
        if not _capture_running(config):
            from mirrorline.capture.session import Capture
            from mirrorline.log.writer import writer_pid

            try:
                Capture(config, once=True).run()
            except MirrorlineError:
                if writer_pid(config.log.path) is None:
                    raise
                # a capture started between the look and ours: it is the one waited for
        confirmed = _confirmed(config)
        if confirmed >= point:
            return
        if time.monotonic() > deadline:
            raise VerifyError(
                f"capture has not reached the verification point {format_lsn(point)} after {wait_seconds:.0f} s "
                f"(the slot {require_source(config).slot} has confirmed {format_lsn(confirmed)})",
                hint="is capture running and keeping up?",
            )
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------------ targets


def target_checksums(
    target: Target, schemas: Sequence[TableSchema], buckets: dict[str, Buckets] | None = None
) -> tuple[Position, dict[str, tuple[int, int] | None], dict[str, str]]:
    """(applied position, per table (rows, sum) or None when missing, notes), read as of one moment
    (:meth:`~mirrorline.apply.target.Target.consistent_read`); ``buckets``: filled with each table's sums per key
    bucket (``verify --diff``)."""
    out: dict[str, tuple[int, int] | None] = {}
    notes: dict[str, str] = {}
    with target.consistent_read() as rd:
        for ts in schemas:
            found = rd.columns(ts.table)
            if found is None:
                out[ts.table] = None
                continue
            lacking = [c for c in ts.column_names if c not in found]
            if lacking:
                out[ts.table], notes[ts.table] = (0, 0), f"target lacks column(s) {', '.join(lacking)}"
                continue
            n, total = 0, 0
            b = Buckets() if buckets is not None else None
            for batch in rd.rows(ts):
                bn, bs = checksum(batch)
                n, total = n + bn, (total + bs) & MASK
                if b is not None:
                    b.add(batch, _key_indexes(ts))
            out[ts.table] = (n, total)
            if buckets is not None and b is not None:
                buckets[ts.table] = b
        return rd.position, out, notes


def compared_text(target: Target, table: str) -> str:
    """What of ``table`` at ``target`` verify compares, when not the whole table."""
    kept = target.needs.history(table)
    return "" if kept is None else "its current versions" if kept[0] == "versions" else "its rows not deleted"


def target_rows_in(
    target: Target, schemas: Sequence[TableSchema], wanted: dict[str, set[int]]
) -> tuple[Position, dict[str, list[tuple[Any, ...]]]]:
    """The target's rows of ``wanted`` buckets per table, with the position they were read at."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with target.consistent_read() as rd:
        for ts in schemas:
            if ts.table in wanted:
                key = _key_indexes(ts)
                out[ts.table] = [r for batch in rd.rows(ts) for r in in_buckets(batch, key, wanted[ts.table])]
        return rd.position, out


ROW_BUDGET = 200_000  # --diff reads at most about this many rows per table and side in its second pass


def pick_buckets(src: Buckets, tgt: Buckets) -> tuple[set[int], bool]:
    """The differing buckets to read again (in bucket order, within :data:`ROW_BUDGET` rows, at least one), and
    whether that is all of them."""
    differing = sorted(src.differing(tgt))
    picked: set[int] = set()
    rows = 0
    for b in differing:
        size = int(src.count[b]) + int(tgt.count[b])
        if picked and rows + size > ROW_BUDGET:
            break
        picked.add(b)
        rows += size
    return picked, len(picked) == len(differing)


def _wait_readable(target: Target, wait: float) -> None:
    """Open a session on ``target``, waiting up to ``wait`` seconds while another process holds the database (a
    live ``run`` lets go of a DuckDB file once verify holds the target's applier lock)."""

    deadline = time.monotonic() + wait
    while True:
        try:
            target.session().close()
            return
        except TargetBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _snapshot_state(target: Target) -> dict[str, snapstate.TableSnapshot]:
    s = target.session()
    try:
        return snapstate.read(s)
    finally:
        s.close()


def verify(
    config: Config,
    targets: Iterable[str] | None = None,
    *,
    attempts: int = 3,
    wait_seconds: float = 120.0,
    diff: int = 0,
) -> VerifyReport:
    """Compare the configured tables of each target (or of ``targets``) with the source at one position. ``diff``:
    for a table that differs, find its differing rows (up to that many reported) by key-bucket checksums; the
    source's snapshot is then held until they are read."""

    names = list(targets) if targets is not None else sorted(config.targets)
    for n in names:
        target_config(config, n)
    cl = ChangeLog(config.log.path)
    # tables gone from the source (renamed, dropped): no change of them comes; status shows them stopped
    gone = {t: r for t, r in stopped.tables(config.log.path).items() if t in config.tables}
    t0 = time.monotonic()
    last_moved = ""
    for _ in range(max(attempts, 1)):
        with contextlib.ExitStack() as held:
            # each target's applier lock first (in name order): a live run pauses applying to it until verify has
            # brought it to the verification point and read it, so that it is read exactly there
            opened: dict[str, Target] = {}
            unreadable: dict[str, str] = {}  # a target that cannot be opened or locked: not compared, said so
            for name in sorted(names):
                try:
                    target = open_target(
                        config.targets[name], threads=config.apply.threads, needs=schema_needs(config, cl, name)
                    )
                    held.callback(target.close)
                    held.enter_context(target.exclusive(wait_seconds))
                    _wait_readable(target, wait_seconds)
                    opened[name] = target
                except MirrorlineError as e:
                    unreadable[name] = str(e)
            for attempt in range(1, ATTEMPTS + 1):
                point = contextlib.ExitStack()
                cp = point.enter_context(consistent_point(config, reconcile=False, create_main=False))
                try:
                    present = dataclasses.replace(
                        config, tables={t: c for t, c in config.tables.items() if t not in gone}
                    )
                    stats = tables_at(present, cp, None, keyless_ok=True)  # (compared as a bag of rows)
                    held_by = target_views(config, names, stats)
                    views = {t: sorted({v[t] for v in held_by.values() if v[t]}) for t in stats}
                    source, src_buckets = source_checksums(config, cp.snapshot, stats, buckets=diff > 0, views=views)
                except Rewritten as e:  # TRUNCATE is not MVCC-safe: the snapshot saw the table empty
                    point.close()
                    retrying(e, "verify", attempt)
                    continue
                except BaseException:
                    point.close()
                    raise
                if diff > 0:
                    held.enter_context(point)  # the snapshot stays for the rows of differing buckets
                else:
                    point.close()
                break
            else:
                raise VerifyError(
                    f"the source rewrote a table (TRUNCATE, VACUUM FULL, CLUSTER or a rewriting ALTER "
                    f"TABLE) after each of {ATTEMPTS} verification points, before it was read",
                    hint="verify when the source is not truncating or rewriting the configured tables continually",
                )
            schemas = [s.schema for s in stats.values()]
            ensure_log(config, cp.lsn, wait_seconds)
            checks: list[TargetCheck] = []
            moved = False
            for name in names:
                if name in unreadable:
                    checks.append(TargetCheck(name, ZERO, error=f"could not be compared: {unreadable[name]}"))
                    continue
                target = opened[name]
                tgt_buckets: dict[str, Buckets] = {}
                snaps = _snapshot_state(target)
                loaded = {t for t, r in snaps.items() if r.state == "loaded"}
                unloaded = [t for t in stats if t not in loaded]
                if unloaded:
                    checks.append(
                        TargetCheck(
                            name,
                            ZERO,
                            error=f"not loaded: {', '.join(unloaded)} (run mirrorline snapshot --target {name})",
                        )
                    )
                    continue
                if target.applied_positions().live < cp.position:
                    try:
                        catch_up(config, name, upto=cp.position, target=target, held_ok=True)
                    except MirrorlineError as e:  # (this target is stopped: the others are compared)
                        checks.append(
                            TargetCheck(name, ZERO, error=f"could not be brought to the verification point: {e}")
                        )
                        continue
                state = target.applied_positions()
                holds = state.holds  # tables stopped alone: not at the point, not compared
                untrusted = untrusted_tables(cl, state)
                pos, sums, notes = target_checksums(target, schemas, tgt_buckets if diff > 0 else None)
                if pos != cp.position:
                    moved, last_moved = True, f"target {name} was at {pos}, not at {cp.position}"
                    break
                tc = TargetCheck(name, pos)
                view = {t: 1 + views[t].index(held_by[name][t]) if held_by[name][t] else 0 for t in stats}
                for t, sides in source.items():
                    rows, total = sides[view[t]]
                    got = sums.get(t)
                    tc.tables.append(
                        TableCheck(
                            t,
                            rows,
                            total,
                            got[0] if got else None,
                            got[1] if got else None,
                            notes.get(t, "" if got is not None else "missing in the target"),
                            compared=compared_text(target, t),
                            not_comparable=_held_text(holds[t])
                            if t in holds
                            else _untrusted_text(name, t, untrusted[t])
                            if t in untrusted
                            else _not_comparable(config, t),
                        )
                    )
                for t, rec in gone.items():
                    tc.tables.append(TableCheck(t, None, None, None, None, not_comparable=_gone_text(rec)))
                if diff > 0:
                    moved = not _diff(
                        config,
                        cp.snapshot,
                        stats,
                        target,
                        tc,
                        {t: b[view[t]] for t, b in src_buckets.items()},
                        tgt_buckets,
                        diff,
                        held_by[name],
                    )
                    if moved:
                        last_moved = f"target {name} moved past {cp.position} while verify read it"
                        break
                checks.append(tc)
            if not moved:
                return VerifyReport(cp.lsn, cp.position, checks, time.monotonic() - t0)
    raise VerifyError(
        f"could not read the targets at the verification point: {last_moved}",
        hint="another process keeps applying to it; pause its apply while verifying",
    )


def _held_text(why: dict[str, str]) -> str:
    """Why a table stopped alone at a target is not compared (it is behind the point; ``status`` shows it)."""
    return f"stopped at the target since {why.get('since', '?')}: {why.get('error', '?')}"


def _gone_text(rec: dict[str, Any]) -> str:
    """Why a table gone from the source is not compared (``status`` shows it stopped)."""
    return (
        f"{rec.get('reason')} (found at {rec.get('position')}): no change of it comes any more and the target keeps "
        "its last rows; remove it from [tables], or configure its new name"
    )


def _untrusted_text(target: str, table: str, mark: str) -> str:
    """Why a table the source changed with nothing logged is not compared (``status`` shows it stopped)."""
    return (
        f"changed at the source with nothing logged ({mark}): the target's rows of it are not the source's any more; "
        f"reload it: mirrorline snapshot --target {target} --table {table}"
    )


def _not_comparable(config: Config, table: str) -> str:
    """Why ``table``'s rows at a target need not be the source's: its ``actions`` drop some kinds of change, or it
    keeps the rows of partitions detached at the source."""
    acts = config.table(table).actions
    if acts >= frozenset("IUD"):
        if config.table(table).detached_partitions == "keep":
            return "detached_partitions = keep: the target keeps the rows of partitions the source detached or dropped"
        return ""
    left = ", ".join({"I": "inserts", "U": "updates", "D": "deletes"}[k] for k in "IUD" if k not in acts)
    return f"actions = {''.join(k for k in 'IUD' if k in acts)}: the target does not take the source's {left}"


def _diff(
    config: Config,
    snapshot: str,
    stats: dict[str, TableStat],
    target: Target,
    tc: TargetCheck,
    src_buckets: dict[str, Buckets],
    tgt_buckets: dict[str, Buckets],
    limit: int,
    lossy: dict[str, Held],
) -> bool:
    """Fill the differing tables' rows (``--diff``); False when the target moved meanwhile."""
    wanted: dict[str, set[int]] = {}
    for c in tc.tables:
        if c.equal or c.table not in tgt_buckets:  # a missing table, or missing columns: nothing row by row
            continue
        wanted[c.table], c.exact = pick_buckets(src_buckets[c.table], tgt_buckets[c.table])
    if not wanted:
        return True
    src_rows = source_rows_in(config, snapshot, stats, wanted)
    pos, tgt_rows = target_rows_in(target, [stats[t].schema for t in wanted], wanted)
    if pos != tc.position:
        return False
    for c in tc.tables:
        if c.table in wanted and c.table not in src_rows:
            c.note = "its rows are not listed: it was rewritten (TRUNCATE?) since the verification point"
        elif c.table in wanted:
            schema = stats[c.table].schema
            key = _key_indexes(schema)
            c.key = [schema.column_names[i] for i in key]
            src = list(held(src_rows[c.table], lossy.get(c.table, ())))  # compared as the target holds it
            c.diffs, c.differing_rows = compare(
                src, tgt_rows[c.table], list(schema.column_names), key, limit, shown=src_rows[c.table]
            )
    return True
