"""Applying the log to one target from its applied position up to a given position: what a loaded target does to
catch up, and what ``verify`` does to bring a target to the exact position it compares at.

Units of work never straddle a per-table applied position above the unit end (a table snapshotted into a live
target): the unit before it ends exactly there, so that the table's changes up to its snapshot are skipped (they are
in the snapshot) and every later one is applied. The lead's pipeline should cut its units the same way
(:func:`unit_bounds`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mirrorline.apply import open_target
from mirrorline.apply.engine import AppliedState, Target
from mirrorline.config import Config
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import set_applied
from mirrorline.model import Change, TableSchema
from mirrorline.position import Position


def unit_bounds(state: AppliedState) -> list[Position]:
    """Positions a unit of work must not straddle: per-table applied positions beyond the target's position."""
    start = state.position
    return sorted({p for p in state.tables.values() if p > start})


def schema_at(log: ChangeLog, table: str, end: Position) -> TableSchema | None:
    """The table's logged schema in force at ``end`` (the newest version recorded since at or before it, else the
    newest one)."""
    log.schemas.refresh()
    versions = log.schemas.versions(table)
    if not versions:
        return None
    fitting = [v for v, s in versions.items() if s.since <= end]
    return versions[max(fitting)] if fitting else versions[max(versions)]


def catch_up(config: Config, name: str, upto: Position | None = None, *, target: Target | None = None,
             max_changes: int | None = None, on_unit: Callable[[Position, int], None] | None = None) -> Position:
    """Apply the log's changes of the configured tables after the target's applied position, up to ``upto``
    (default: everything the log holds), in units of at most ``max_changes``; returns the applied position."""
    from pyspark.sql import functions as F

    from mirrorline.compile.spark import actions_from_config, compile_changes
    from mirrorline.log.spark import read_spark

    own = target is None
    t = target or open_target(config.targets[name], threads=config.apply.threads)
    cl = ChangeLog(config.log.path)
    limit = max_changes or config.apply.max_changes
    configured = sorted(config.tables)
    actions = actions_from_config(config.tables)
    try:
        state = t.applied_positions()
        pos = state.position
        end = upto if upto is not None else (cl.durable() if cl.layout.exists() else None)
        if end is None:
            return pos
        bounds = unit_bounds(state)
        while pos < end:
            stop = min([b for b in bounds if b > pos] + [end])
            nxt, n = cl.advance(pos, limit, upto=stop)
            if nxt is None or n == 0 or nxt <= pos:
                nxt = stop
            df = read_spark(cl, pos, nxt).where(F.col("table").isin(configured))
            batch = compile_changes(df, actions=actions, start=pos, end=nxt)
            try:
                tables = list(batch.tables) + [x for x in batch.truncated if x not in batch.tables]
                schemas: dict[str, TableSchema] = {}
                for tb in tables:
                    s = schema_at(cl, tb, nxt)
                    if s is not None:
                        schemas[tb] = s
                t.apply(batch, schemas, _changes(cl, pos, nxt, configured, config))
            finally:
                batch.release()
            if on_unit is not None:
                on_unit(nxt, n)
            pos = nxt
        applied = t.applied_positions().position
        set_applied(cl, name, applied)
        return applied
    finally:
        if own:
            t.close()


def _changes(cl: ChangeLog, start: Position, end: Position, tables: Iterable[str], config: Config
             ) -> Callable[[], list[Change]]:
    """The unit's changes in log order after per-table actions, for apply's failure path."""
    wanted = set(tables)

    def load() -> list[Change]:
        from mirrorline.compile.reference import kept_changes
        from mirrorline.compile.spark import actions_from_config

        return list(kept_changes((c for c in cl.read(start, end) if c.table in wanted),
                                 actions_from_config(config.tables)))

    return load


