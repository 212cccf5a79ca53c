"""The Delta target: a table format (:class:`~mirrorline.apply.lake.target.LakeTarget`) written with delta-rs: each
unit's rows of a table one MERGE, its position in the commits, schema changes, compaction and cleanup (the package's
docstring says how)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply.delta.dialect import DELTA, _open, _table_of, commit_properties, table_position
from mirrorline.apply.lake.dialect import GROUP_COL, OP_COL, Conflict, fit
from mirrorline.apply.lake.plan import BagPlan, Plan
from mirrorline.apply.lake.target import LakeTarget
from mirrorline.apply.reshape import Step
from mirrorline.apply.sql import parse_mask
from mirrorline.apply.state import ensure as ensure_state
from mirrorline.apply.state import write_shape
from mirrorline.errors import ApplyError, TargetError, TransientTargetError, first_line
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)


class DeltaTarget(LakeTarget):
    kind = "delta"
    dialect = DELTA

    def path(self, table: str) -> Path:
        return self.dialect.table_dir(self.root, table)

    def delta_table(self, table: str) -> DeltaTable | None:
        return _open(self.path(table))

    def tables(self) -> dict[str, DeltaTable]:
        """The Delta tables under the target's folder, by folder name."""
        out = {}
        if self.root.is_dir():
            for p in sorted(self.root.iterdir()):
                dt = _open(p) if p.is_dir() else None
                if dt is not None:
                    out[p.name] = dt
        return out

    # -- the table format (LakeTarget) -----------------------------------------------------------------------------
    def open_table(self, table: str) -> DeltaTable | None:
        return self.delta_table(table)

    def table_positions(self) -> dict[str, Position]:
        return {_table_of(folder): table_position(dt, self.name) for folder, dt in self.tables().items()}

    def table_position(self, handle: DeltaTable) -> Position:
        return table_position(handle, self.name)

    def columns_of(self, handle: DeltaTable) -> list[str]:
        return [f.name for f in handle.schema().fields]

    def current_rows(self, handle: DeltaTable, ts: TableSchema, rows: dict[str, pa.Table]) -> Any:
        return handle.to_pyarrow_dataset()

    def batches(self, handle: DeltaTable, columns: list[str]) -> Iterator[pa.RecordBatch]:
        return iter(handle.to_pyarrow_dataset().to_batches(columns=columns, batch_size=10_000))

    def as_of(self, table: str, handle: DeltaTable, position: Position) -> DeltaTable:
        """The version of the table's last commit by this target at or before ``position`` (later commits of
        others, such as a compaction, change no rows)."""
        for commit in handle.history():
            pos = commit.get("mirrorline.position")
            if commit.get("mirrorline.target") == self.name and pos and Position.parse(pos) <= position:
                handle.load_as_version(int(commit["version"]))
                return handle
            if commit.get("operation") in ("CREATE TABLE", "CREATE OR REPLACE TABLE"):
                handle.load_as_version(int(commit["version"]))
                return handle
        raise TargetError(
            f"target {self.name}: {table} is ahead of the target's position {position} and its history no longer "
            "holds the version at that position",
            hint="run mirrorline again so that the target's position catches up with its tables, then verify",
            target=self.name,
            table=table,
        )

    def commit_rows(
        self, handle: DeltaTable, ts: TableSchema, src: pa.Table, plan: Plan, truncated: bool, position: Position
    ) -> None:
        """A MERGE (appended when the rows are all inserts, none there: checked; written over the table when the
        unit truncated it)."""
        from deltalake import write_deltalake

        ops = src[OP_COL]
        props = commit_properties(self.name, position)
        schema = pa.schema(handle.schema().to_arrow())
        if truncated:
            keep = src.filter(pc.invert(pc.equal(ops, "D")))
            write_deltalake(handle, fit(keep, schema), mode="overwrite", commit_properties=props)
        elif src.num_rows == 0 or pc.all(pc.equal(ops, "I")).as_py():
            write_deltalake(handle, fit(src, schema), mode="append", commit_properties=props)
        elif isinstance(plan, BagPlan):
            _merge_bag(plan, handle, src, props)
        else:
            _merge(plan, handle, src, props)

    # -- schema ----------------------------------------------------------------------------------------------------
    def reshape(self, ts: TableSchema, step: Step) -> str:
        """Write the table again as ``step`` (a rebuild) says (:meth:`rebuilt_rows`): one overwrite that replaces its
        schema, the table's position kept."""
        from deltalake import write_deltalake

        with self._lock(ts.table):
            dt = self.delta_table(ts.table)
            assert dt is not None
            rows = self.rebuilt_rows(ts, step, dt.to_pyarrow_table())
            props = commit_properties(self.name, table_position(dt, self.name))
            with self._writing(ts.table, table_position(dt, self.name), redo=False):
                write_deltalake(dt, rows, mode="overwrite", schema_mode="overwrite", commit_properties=props)
        return step.describe()

    def recreate(self, schemas: Iterable[TableSchema]) -> None:
        self.ensure_schema(schemas)

    def ensure_schema(self, schemas: Iterable[TableSchema], record: bool = True) -> list[str]:
        """Create missing tables and add missing columns (a snapshot's shape, or a unit's columns added), and, with
        ``record``, record each as the shape its table has (what a snapshot loaded)."""
        from deltalake import DeltaTable
        from deltalake.schema import Field

        schemas = list(schemas)
        shaped = [self.shape(ts) for ts in schemas]  # (a table kept with its history: with its columns)
        for ts in shaped:
            for c in ts.columns:
                self.dialect.type_info(ts.table, c)
        done: list[str] = []
        for ts in shaped:
            path = self.path(ts.table)
            want = self.dialect.arrow_schema(ts)
            with self._writing(ts.table, ZERO, redo=False):
                self.root.mkdir(parents=True, exist_ok=True)
                dt = _open(path)
                if dt is None:
                    DeltaTable.create(str(path), want, name=ts.table)
                    done.append(f"created {ts.table}")
                    self._lossy_note(ts)
                    continue
                have = {f.name for f in dt.schema().fields}
                new = [f for f in want if f.name not in have]
                if new:
                    dt.alter.add_columns([Field.from_arrow(f) for f in new])
                    done.extend(f"added {ts.table}.{f.name}" for f in new)
        if record:
            with self.transaction() as s:
                ensure_state(s)
                for ts in schemas:
                    write_shape(s, ts, 0)
        return done

    # -- writes ----------------------------------------------------------------------------------------------------
    def write(self, table: str, parts: Sequence[pa.Table], position: Position, overwrite: bool) -> None:
        """Add ``parts`` to the table's rows, or replace them (``overwrite``), in one commit carrying ``position``
        (a snapshot's load)."""
        from deltalake import write_deltalake

        dt = self.delta_table(table)
        if dt is None:
            raise TargetError(f"target {self.name}: no Delta table for {table} at {self.path(table)}", target=self.name)
        schema = pa.schema(dt.schema().to_arrow())
        data = pa.concat_tables([fit(p, schema) for p in parts]) if parts else schema.empty_table()
        props = commit_properties(self.name, position)
        with self._lock(table), self._writing(table, position):
            if overwrite:
                write_deltalake(dt, data, mode="overwrite", commit_properties=props)
            else:
                write_deltalake(dt, data, mode="append", commit_properties=props)

    @contextlib.contextmanager
    def _writing(self, table: str, end: Position, redo: bool = True) -> Iterator[None]:
        """A Delta write's failure as mirrorline's error: a table constraint (CHECK, NOT NULL) the rows break is
        the data's (ApplyError), anything else the target's (nothing was committed either way)."""
        from deltalake.exceptions import CommitFailedError, DeltaError

        try:
            yield
        except CommitFailedError as e:
            if redo:  # the caller applies again on the new version
                raise Conflict(first_line(e)) from e
            raise TransientTargetError(
                f"target {self.name}: another writer committed to the Delta table {table} first: {first_line(e)}",
                hint="nothing was committed; run again",
                target=self.name,
                table=table,
            ) from e
        except (DeltaError, OSError, pa.ArrowException) as e:
            msg = first_line(e)
            ctx: dict[str, Any] = {"target": self.name, "table": table, "position": str(end)}
            if "violat" in msg.lower() or "failed validation" in msg.lower():
                raise ApplyError(
                    f"target {self.name}: the unit up to {end} breaks a constraint of the Delta table {table}: {msg}",
                    hint="drop or change the constraint at the target (or fix the row at the source) and run again",
                    db_message=msg,
                    **ctx,
                ) from e
            cls = TransientTargetError if isinstance(e, OSError) else TargetError
            raise cls(
                f"target {self.name}: writing the Delta table {table} failed: {msg}",
                hint="nothing was committed to this table; check the target folder and run again",
                **ctx,
            ) from e

    # -- upkeep ----------------------------------------------------------------------------------------------------
    def maintain(self, *, retention_hours: int = 168, compact: bool = True, vacuum: bool = True) -> dict[str, Any]:
        """Compact each table's small files (one commit per table, no data change) and remove files no version
        younger than ``retention_hours`` reads. Apply waits only for the commit of each table's compaction."""

        out: dict[str, Any] = {}
        for folder, dt in self.tables().items():
            out[folder] = self._maintain_table(folder, dt, retention_hours, compact, vacuum)
        return out

    def _maintain_table(
        self, folder: str, dt: DeltaTable, retention_hours: int, compact: bool, vacuum: bool
    ) -> dict[str, Any]:
        """One table's upkeep; a commit that meets a unit's is left for the next round, any other failure is the
        target's error (nothing is lost: a compaction changes no rows)."""
        from deltalake.exceptions import CommitFailedError

        entry: dict[str, Any] = {}
        with self._writing(_table_of(folder), ZERO, redo=False):
            if compact:
                try:
                    with self._lock(_table_of(folder)):
                        dt.update_incremental()
                        m = dt.optimize.compact()
                    entry["compacted"] = {"removed": m.get("numFilesRemoved", 0), "added": m.get("numFilesAdded", 0)}
                except CommitFailedError as e:  # a unit committed first: compact at the next round
                    entry["compacted"] = {"skipped": first_line(e)}
            if vacuum:
                try:
                    with self._lock(_table_of(folder)):
                        dt.update_incremental()
                    removed = dt.vacuum(
                        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
                    )
                    entry["vacuumed"] = len(removed)
                except CommitFailedError as e:
                    entry["vacuumed"] = {"skipped": first_line(e)}
        return entry

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per table: its Delta version, file count and the position its last commit applied."""
        out = {}
        for folder, dt in self.tables().items():
            out[folder] = {
                "version": dt.version(),
                "files": len(dt.file_uris()),
                "position": str(table_position(dt, self.name)),
            }
        return out


def _merge(plan: Plan, dt: DeltaTable, src: pa.Table, props: Any) -> None:
    """A keyed table's MERGE: deletes; updates of the columns sent, a clause per set of unsent columns;
    inserts (and, in mirror mode, updates of rows not there)."""
    ts = plan.ts
    cols = list(ts.column_names)
    value_cols = [c for c in cols if c not in ts.key]
    s = {c: f"s.{quote_ident(c)}" for c in cols}
    pred = " AND ".join(
        f"(t.{quote_ident(k)} {'IS NOT DISTINCT FROM' if ts.column(k).nullable else '='} s.{quote_ident(k)})"
        for k in ts.key
    )
    m = dt.merge(src, predicate=pred, source_alias="s", target_alias="t", commit_properties=props)
    m = m.when_matched_delete(predicate=f"s.{OP_COL} = 'D'")
    m = m.when_matched_update(updates=s, predicate=f"s.{OP_COL} = 'R'")
    for i, mask in enumerate(plan.masks):
        kept = parse_mask(mask)
        set_cols = [c for c in value_cols if c not in kept]
        if set_cols:
            m = m.when_matched_update(
                updates={c: s[c] for c in set_cols}, predicate=f"s.{OP_COL} = 'U' AND s.{GROUP_COL} = {i}"
            )
    if plan.mirror and "" in plan.masks:
        m = m.when_not_matched_insert(
            updates=s, predicate=f"s.{OP_COL} = 'U' AND s.{GROUP_COL} = {plan.masks.index('')}"
        )
    m = m.when_not_matched_insert(updates=s, predicate=f"s.{OP_COL} IN ('I', 'R')")
    m.execute()


def _merge_bag(plan: Plan, dt: DeltaTable, src: pa.Table, props: Any) -> None:
    """A bag's MERGE: each image the unit deletes copies of deleted whole, the copies it keeps and the new
    rows inserted."""
    pred = " AND ".join(
        f"(t.{quote_ident(c)} {'IS NOT DISTINCT FROM' if plan.ts.column(c).nullable else '='} s.{quote_ident(c)})"
        for c in plan.ts.key
    )
    m = dt.merge(
        src, predicate=f"s.{OP_COL} = 'D' AND {pred}", source_alias="s", target_alias="t", commit_properties=props
    )
    m = m.when_matched_delete()
    m = m.when_not_matched_insert(
        updates={c: f"s.{quote_ident(c)}" for c in plan.ts.column_names}, predicate=f"s.{OP_COL} = 'I'"
    )
    m.execute()
