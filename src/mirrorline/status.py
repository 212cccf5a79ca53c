"""``mirrorline status``: per target its state, applied position and lag (seconds and bytes); the log; the slot's
retained WAL; warnings when one slow target makes the log or the slot grow. The same figures as Prometheus text
exposition (:func:`render_prometheus`, :func:`write_prometheus`) for a running pipeline.

Lag: in seconds, the age of the oldest change committed at the source that the target has not applied: the oldest
in the log beyond its position, or, while no capture holds the slot, the oldest the slot holds that the log lacks
(peeked through pgoutput: a dead ``run`` shows); in bytes, how much WAL lies between the target's applied position
and the source's current position (0 when it has applied everything the log holds). A target stopped by an error is
``stopped``, with the error and since when; so is a table stopped alone at a target (held: its other tables go on),
whose oldest change not applied counts in the target's lag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2

from mirrorline import stopped
from mirrorline.apply import open_target
from mirrorline.apply.lock import TargetBusy
from mirrorline.apply.state import AppliedState
from mirrorline.capture.source import connect
from mirrorline.config import Config, redact_dsn
from mirrorline.errors import MirrorlineError, first_line
from mirrorline.log.layout import write_atomic
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import exports, needs_reload, readers, reload_reason, tree_size, unconfigured
from mirrorline.model import quote_ident
from mirrorline.pipeline.targets import untrusted_tables
from mirrorline.position import Position, format_lsn, parse_lsn
from mirrorline.snapshot import state as snapstate
from mirrorline.snapshot.state import STATES, WAITING

STOPPED = "stopped"  # a target stopped by an error (its record under the log's stopped/)
LAG_WARN_SECONDS = 300.0
LAG_WARN_BYTES = 1 << 30
SLOT_WARN_BYTES = 1 << 30


@dataclass
class TargetStatus:
    name: str
    kind: str
    state: str
    position: Position | None
    lag_seconds: float | None = None
    lag_bytes: int | None = None
    tables: dict[str, str] = field(default_factory=dict)  # table -> its snapshot state
    error: str = ""
    details: dict[str, dict[str, Any]] = field(default_factory=dict)  # per table (Delta: version, files, position)
    reload: str = ""  # why the target needs a reload
    # tables stopped alone at the target: table -> {"error", "kind", "since", "position"}
    stopped_tables: dict[str, dict[str, str]] = field(default_factory=dict)
    # the tables it keeps other than as they are now (history mode): table -> mode; "*": its default for every table
    history: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "position": str(self.position) if self.position is not None else None,
            "lag_seconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
            "lag_bytes": self.lag_bytes,
            "tables": self.tables,
            "error": self.error or None,
            "stopped_tables": self.stopped_tables,
            **({"history": self.history} if self.history else {}),
            **({"table_details": self.details} if self.details else {}),
        }


@dataclass
class Status:
    source: str = ""
    spark_master: str = ""
    slot: str = ""
    current_lsn: int | None = None
    slot_restart_lsn: int | None = None
    slot_confirmed_lsn: int | None = None
    slot_retained_bytes: int | None = None
    slot_active: bool | None = None
    uncaptured_since: float | None = None  # the commit time of the oldest change the log lacks (slot inactive)
    log_durable: Position | None = None
    log_bytes: int = 0
    log_segments: int = 0
    targets: list[TargetStatus] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def problems(self, max_lag: float | None = None) -> list[str]:
        """What makes replication unhealthy now: the source or the log unreachable, a target that cannot be read,
        and (``max_lag``, seconds) a target further behind than that."""
        out = list(self.errors)
        for t in self.targets:
            for table, why in t.stopped_tables.items():
                out.append(f"target {t.name}: table {table} {_stopped_text(why)}")
            if t.error:
                out.append(f"target {t.name}: {t.error}")
            elif t.state == "needs reload":
                out.append(f"target {t.name} needs a reload ({t.reload}): mirrorline snapshot --target {t.name}")
            elif max_lag is not None and t.lag_seconds is not None and t.lag_seconds > max_lag:
                out.append(f"target {t.name} is {t.lag_seconds:.1f} s behind (more than {max_lag:g} s)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "source": {"dsn": self.source, "current_lsn": _lsn(self.current_lsn)},
            "spark": {"master": self.spark_master},
            "slot": {
                "name": self.slot,
                "active": self.slot_active,
                "restart_lsn": _lsn(self.slot_restart_lsn),
                "confirmed_flush_lsn": _lsn(self.slot_confirmed_lsn),
                "retained_wal_bytes": self.slot_retained_bytes,
            },
            "log": {
                "durable": str(self.log_durable) if self.log_durable else None,
                "bytes": self.log_bytes,
                "segments": self.log_segments,
            },
            "targets": [t.to_json() for t in self.targets],
            "warnings": self.warnings,
            "errors": self.errors,
        }

    def text(self) -> str:
        lines = [f"source {self.source}: current WAL {_lsn(self.current_lsn) or '?'}"]
        if self.slot_retained_bytes is not None:
            lines.append(
                f"slot {self.slot}: {'active' if self.slot_active else 'inactive'}, confirmed "
                f"{_lsn(self.slot_confirmed_lsn)}, retains {_size(self.slot_retained_bytes)} of WAL"
            )
        else:
            lines.append(f"slot {self.slot}: not created yet")
        lines.append(
            f"log: {self.log_segments} segment(s), {_size(self.log_bytes)}, durable up to "
            f"{self.log_durable or 'nothing'}"
        )
        if self.spark_master:
            lines.append(f"spark: master {self.spark_master}")
        for t in self.targets:
            lag = ""
            if t.lag_seconds is not None or t.lag_bytes is not None:
                lag = f", lag {t.lag_seconds or 0:.1f} s / {_size(t.lag_bytes or 0)}"
            err = f" ({t.error})" if t.error else ""
            lines.append(f"target {t.name} ({t.kind}): {t.state}, applied {t.position or '-'}{lag}{err}")
            for table, mode in t.history.items():
                lines.append(f"  {'every table' if table == '*' else table}: history mode {mode}")
            for table, why in t.stopped_tables.items():
                lines.append(f"  {table}: {_stopped_text(why)}")
            for table, d in t.details.items():
                lines.append(f"  {table}: " + ", ".join(f"{k} {v}" for k, v in d.items()))
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)


def _stopped_text(why: dict[str, str]) -> str:
    return (
        f"stopped since {why.get('since', '?')} at {why.get('position', '?')} (the target's other tables go on): "
        f"{why.get('error', '?')}"
    )


def _lsn(v: int | None) -> str | None:
    return format_lsn(v) if v is not None else None


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def cap_note(max_age: float, max_size: int, age: float | None, log_bytes: int) -> str:
    """For a reader holding the log whose oldest unapplied change is ``age`` seconds old (None: unknown): how long
    until the log's cap (``[log] max_age``, ``max_size``) removes what it still needs, which makes it need a
    reload."""
    if max_age <= 0 and max_size <= 0:
        return "the log has no cap ([log] max_age, max_size): it grows for as long as this lasts"
    parts = []
    if max_age > 0 and age is not None:
        parts.append(f"max_age ({_duration(max_age)}) removes its oldest change in {_duration(max(max_age - age, 0))}")
    if max_size > 0:
        parts.append(
            f"max_size removes the oldest changes once the log holds {_size(max_size)} (now {_size(log_bytes)}, "
            f"{log_bytes / max_size:.0%})"
        )
    if not parts:
        return f"max_age ({_duration(max_age)}) then removes what it still needs, and it needs a reload"
    return "then it needs a reload: " + "; ".join(parts)


def _age_after(cl: Any, position: Position | None, now: float) -> float | None:
    """The age of the first change after ``position`` in the log (None: none, or it cannot be read)."""
    try:
        ts = cl.first_ts_after(position)
    except Exception:
        return None
    return now - ts / 1e6 if ts is not None else None


def _size(n: int) -> str:
    x = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if x < 1024 or unit == "GB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} GB"


def _source(config: Config, st: Status) -> None:

    src = config.source
    if src is None:
        return
    st.source, st.slot = redact_dsn(src.dsn), src.slot
    try:
        conn = connect(src.dsn)
    except MirrorlineError as e:
        st.errors.append(f"source: {e}")
        return
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            st.current_lsn = parse_lsn(cur.fetchone()[0])
            cur.execute(
                "SELECT restart_lsn::text, confirmed_flush_lsn::text, active, "
                "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (src.slot,),
            )
            row = cur.fetchone()
            if row:
                st.slot_restart_lsn = parse_lsn(row[0]) if row[0] else None
                st.slot_confirmed_lsn = parse_lsn(row[1]) if row[1] else None
                st.slot_active = bool(row[2])
                st.slot_retained_bytes = int(row[3]) if row[3] is not None else None
            if row and not st.slot_active:
                st.uncaptured_since = _first_uncaptured(cur, src.slot, src.publication)
    except psycopg2.Error as e:
        st.errors.append(f"source: {str(e).strip().splitlines()[0]}")
    finally:
        conn.close()
    if st.uncaptured_since is not None:
        age = max(0.0, time.time() - st.uncaptured_since)
        st.errors.append(
            f"capture is not running: the slot {src.slot} is inactive and the source has changes committed "
            f"{age:.1f} s ago that the log does not hold (start `mirrorline run`)"
        )


PG_EPOCH = 946_684_800  # 2000-01-01 in Unix seconds: pgoutput's timestamps count from it


def _first_uncaptured(cur: Any, slot: str, publication: str) -> float | None:
    """The commit time (Unix seconds) of the first transaction the inactive ``slot`` holds that capture has not
    taken, peeked (not consumed) through pgoutput; None when there is none."""
    cur.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, 1, 'proto_version', '1', "
        "'publication_names', %s) LIMIT 1",
        (slot, quote_ident(publication)),
    )
    row = cur.fetchone()
    if not row:
        return None
    data = bytes(row[0])
    if data[:1] != b"B" or len(data) < 17:
        return None
    micros = int.from_bytes(data[9:17], "big", signed=True)  # Begin: 'B', final LSN, commit timestamp, xid
    return PG_EPOCH + micros / 1e6


def _log(config: Config, st: Status) -> Any:

    cl = ChangeLog(config.log.path)
    if not cl.layout.exists():
        return None
    try:
        segs = cl.segments()
        st.log_segments = len(segs)
        st.log_durable = cl.durable()
        st.log_bytes = sum(tree_size(s.path) for s in segs)
    except MirrorlineError as e:
        st.errors.append(f"log: {e}")
        return None
    return cl


def _target(config: Config, name: str, st: Status, cl: Any) -> TargetStatus:

    tcfg = config.targets[name]
    ts = TargetStatus(name, tcfg.kind, snapstate.NEW, None)
    if config.tables:
        ts.history = {t: kept[0] for t in sorted(config.tables) if (kept := tcfg.history_of(t)) is not None}
    elif tcfg.history != "none":
        ts.history = {"*": tcfg.history}
    busy = False
    try:
        # (a database another process holds: reported from the log, not waited for)
        target = open_target(tcfg, open_wait=0.0)
        try:
            s = target.session()
            try:
                snaps = snapstate.read(s)
            finally:
                s.close()
            state = target.applied_positions()
            applied = state.position if snaps else None  # (a target never loaded is new, whatever it applied)
            ts.details = target.describe()
        finally:
            target.close()
    except TargetBusy:  # a process that applies to it holds the database (DuckDB): its position from the log
        from mirrorline.log.retention import readers

        reader = readers(cl).get(name) if cl is not None else None
        if reader is None or reader.applied is None:
            ts.error = f"another process holds the database open, and the log has no position of {name}"
            return ts
        busy, snaps, state, applied = True, {}, AppliedState(), reader.applied
        ts.details = {"(database)": {"held by": "the process that applies to it; position from the log's registry"}}
    except MirrorlineError as e:
        ts.error = str(e)
        return ts
    except Exception as e:
        ts.error = first_line(e)
        return ts
    stop = stopped.read(config.log.path).get(name)
    if stop is not None:
        ts.error = f"stopped at {stop.get('at')} applying up to {stop.get('position')}: {stop.get('error')}"
    ts.tables = {t: r.state for t, r in snaps.items()}
    for t in state.held:
        ts.tables[t] = STOPPED
        ts.stopped_tables[t] = {**state.holds.get(t, {}), "position": str(state.table(t))}
    for t, why in untrusted_tables(cl, state).items():  # its rows changed at the source with nothing logged
        ts.tables[t] = STOPPED
        ts.stopped_tables[t] = {
            "error": f"{t} at the source changed without a change logged ({why}): the target's rows of it are not "
            f"the source's any more; reload it: mirrorline snapshot --target {name} --table {t}",
            "kind": "Resync",
            "position": str(state.table(t)),
        }
    ts.position = applied
    if applied is None:
        if tcfg.initial == "files" and not any(r.state == "loading" for r in snaps.values()):
            ts.state = snapstate.WAITING
        return ts
    log_has_all = cl is None or st.log_durable is None or applied >= st.log_durable
    confirmed = st.slot_confirmed_lsn or 0
    ends = [r.end_lsn for t, r in snaps.items() if t in config.tables and r.state == "loaded"]
    caught_up = log_has_all and bool(ends) and confirmed >= max(ends)
    ts.state = snapstate.target_state(snaps, config.tables, applied, caught_up)
    if busy:
        ts.state = snapstate.LIVE if log_has_all else snapstate.CATCHING_UP
    if cl is not None:
        record = needs_reload(cl).get(name)
        if record is not None:  # the log no longer holds what it needs: no lag to measure
            ts.state = snapstate.NEEDS_RELOAD
            ts.reload = reload_reason(record)
            return ts
    if cl is not None and not log_has_all:
        try:
            first = cl.first_ts_after(applied)
        except MirrorlineError as e:  # behind what the log retains: reported, not raised
            ts.error = str(e)
            return ts
        ts.lag_seconds = max(0.0, time.time() - first / 1e6) if first is not None else 0.0
    else:
        ts.lag_seconds = 0.0
    if st.uncaptured_since is not None:  # changes committed at the source that no target has: capture is down
        ts.lag_seconds = max(ts.lag_seconds, time.time() - st.uncaptured_since)
    if stop is not None:
        ts.state = STOPPED
    if log_has_all:
        ts.lag_bytes = 0
    elif st.current_lsn is not None:
        ts.lag_bytes = max(0, st.current_lsn - applied.lsn)
    return ts


def status(config: Config) -> Status:
    """Gather every figure; what cannot be reached is reported in ``errors``, never raised."""
    st = Status(spark_master=config.spark.master_or_default())
    _source(config, st)
    cl = _log(config, st)
    for name in sorted(config.targets):
        st.targets.append(_target(config, name, st, cl))
    _warn(config, st)
    if cl is not None:
        _warn_readers(config, st, cl)
    return st


EXPORT_WARN_SECONDS = 86_400.0  # warn this long before an export folder stops holding the log


def _warn_readers(config: Config, st: Status, cl: Any, now: float | None = None) -> None:
    """Readers that hold the log and will not apply it: targets waiting for files, targets removed from the
    configuration; export folders not loaded, shortly before they expire."""
    import time

    now = time.time() if now is None else now
    cap = config.log

    def note(position: Position | None) -> str:
        return cap_note(cap.max_age, cap.max_size, _age_after(cl, position, now), st.log_bytes)

    registered = readers(cl)
    for t in st.targets:
        if t.state == WAITING and t.name in registered:
            since = registered[t.name].applied
            st.warnings.append(
                f'target {t.name} waits for files (initial = "files"): the log keeps every change '
                f"{f'after {since}' if since is not None else 'it holds'} for it ({_size(st.log_bytes)} now) until "
                f"an export is loaded into it (`mirrorline snapshot export DIR`, then `mirrorline snapshot load "
                f"--target {t.name} DIR/<export>`); {note(since)}"
            )
    for name, r in sorted(unconfigured(cl, config.targets).items()):
        st.warnings.append(
            f"target {name} is no longer configured but the log keeps every change after its position "
            f"{r.applied}: run `mirrorline target drop {name}` (or start run with --forget-removed); {note(r.applied)}"
        )
    expiry = config.log.export_expiry
    for name, r in sorted(exports(cl).items()):
        left = expiry - (now - r.updated) if expiry > 0 else None
        if left is not None and left < EXPORT_WARN_SECONDS:
            st.warnings.append(
                f"{name} has not been loaded: in {max(left, 0) / 3600:.1f} h it no longer holds the log "
                f"(export_expiry); load it with `mirrorline snapshot load`, or drop it with `mirrorline target drop "
                f"{name}`"
            )


def _warn(
    config: Config,
    st: Status,
    lag_seconds: float = LAG_WARN_SECONDS,
    lag_bytes: int = LAG_WARN_BYTES,
    slot_bytes: int = SLOT_WARN_BYTES,
) -> None:
    loaded = [t for t in st.targets if t.position is not None]
    if loaded:
        slowest = min(loaded, key=lambda t: t.position or Position(0))
        others = [t for t in loaded if t is not slowest]
        slow = (slowest.lag_seconds or 0) > lag_seconds or (slowest.lag_bytes or 0) > lag_bytes
        ahead = not others or all((t.lag_bytes or 0) < (slowest.lag_bytes or 0) for t in others)
        if slow and ahead:
            st.warnings.append(
                f"target {slowest.name} is {slowest.lag_seconds or 0:.0f} s / {_size(slowest.lag_bytes or 0)} behind: "
                f"the log keeps everything after its position {slowest.position} ({_size(st.log_bytes)} now); "
                "speed it up, or remove it from the configuration and drop it (mirrorline target drop); "
                + cap_note(config.log.max_age, config.log.max_size, slowest.lag_seconds, st.log_bytes)
            )
    for table, rec in stopped.tables(config.log.path).items():
        if table in config.tables:
            st.warnings.append(
                f"table {table} stopped: {rec.get('reason')} (found at {rec.get('position')}); no change of it comes "
                "any more and the targets keep its last rows; remove it from [tables], or configure its new name "
                "(run then loads it into every target)"
            )
    if st.slot_retained_bytes is not None and st.slot_retained_bytes > slot_bytes:
        st.warnings.append(
            f"slot {st.slot} retains {_size(st.slot_retained_bytes)} of WAL on the source: capture "
            f"is behind or stopped (confirmed {_lsn(st.slot_confirmed_lsn)})"
        )


# ------------------------------------------------------------------------------------------------------ Prometheus


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_prometheus(st: Status) -> str:
    """The status as Prometheus text exposition format (version 0.0.4)."""
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float | int | None]]) -> None:
        rows = [(labels, v) for labels, v in samples if v is not None]
        if not rows:
            return
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, v in rows:
            lab = ",".join(f'{k}="{_esc(x)}"' for k, x in labels.items())
            out.append(f"{name}{{{lab}}} {v}" if lab else f"{name} {v}")

    slot = {"slot": st.slot}
    metric("mirrorline_source_wal_lsn", "gauge", "The source's current WAL position (bytes).", [({}, st.current_lsn)])
    metric(
        "mirrorline_slot_retained_wal_bytes",
        "gauge",
        "WAL the replication slot keeps on the source.",
        [(slot, st.slot_retained_bytes)],
    )
    metric(
        "mirrorline_slot_confirmed_flush_lsn",
        "gauge",
        "What capture has confirmed as durable (bytes).",
        [(slot, st.slot_confirmed_lsn)],
    )
    metric("mirrorline_log_bytes", "gauge", "Size of the change log's retained segments.", [({}, st.log_bytes)])
    metric("mirrorline_log_segments", "gauge", "Retained segments in the change log.", [({}, st.log_segments)])
    metric(
        "mirrorline_log_durable_lsn",
        "gauge",
        "Commit LSN of the log's last durable change.",
        [({}, st.log_durable.lsn if st.log_durable else None)],
    )
    metric(
        "mirrorline_target_applied_lsn",
        "gauge",
        "Commit LSN of the target's applied position.",
        [({"target": t.name}, t.position.lsn if t.position else None) for t in st.targets],
    )
    metric(
        "mirrorline_target_lag_seconds",
        "gauge",
        "Age of the oldest change the target has not applied.",
        [({"target": t.name}, t.lag_seconds) for t in st.targets],
    )
    metric(
        "mirrorline_target_lag_bytes",
        "gauge",
        "WAL between the target's applied position and the source.",
        [({"target": t.name}, t.lag_bytes) for t in st.targets],
    )
    metric(
        "mirrorline_target_state",
        "gauge",
        "1 for the target's current state.",
        [({"target": t.name, "state": s}, 1 if t.state == s else 0) for t in st.targets for s in STATES],
    )
    metric(
        "mirrorline_table_stopped",
        "gauge",
        "1 for a table stopped alone at the target (its other tables go on), else 0.",
        [({"target": t.name, "table": x}, 1 if x in t.stopped_tables else 0) for t in st.targets for x in t.tables],
    )
    metric(
        "mirrorline_warnings", "gauge", "Warnings status reports (slow target, growing slot).", [({}, len(st.warnings))]
    )
    return "\n".join(out) + "\n"


def write_prometheus(st: Status, path: str | Path) -> None:
    """Rewrite ``path`` atomically (for node_exporter's textfile collector, or any scraper of files)."""
    write_atomic(Path(path), render_prometheus(st).encode())
