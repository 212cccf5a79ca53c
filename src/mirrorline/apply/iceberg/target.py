"""The Iceberg target: a table format (:class:`~mirrorline.apply.lake.target.LakeTarget`) written with pyiceberg: each
unit's rows of a table one Iceberg commit (its deletes by key and its appends in one transaction, the position in the
table's properties), schema changes by Iceberg's own schema evolution, compaction, expiry and orphan files (the
package's docstring says how)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply.iceberg.dialect import (
    ICEBERG,
    POSITION_PROP,
    TABLE_PROP,
    WAREHOUSE,
    folder_name,
    open_catalog,
    snapshot_position,
    table_position,
)
from mirrorline.apply.lake.dialect import GROUP_COL, OP_COL, Conflict, duck_connection, fit
from mirrorline.apply.lake.plan import BagPlan, Plan
from mirrorline.apply.lake.target import LakeTarget
from mirrorline.apply.reshape import Step
from mirrorline.apply.sql import key_col, lit, moved_col, parse_mask
from mirrorline.apply.state import ensure as ensure_state
from mirrorline.apply.state import write_shape
from mirrorline.errors import ApplyError, TargetError, TransientTargetError, first_line
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

IN_KEYS = 256  # a unit naming at most this many first key column values of a table filters by each value
RANGES = 16  # ... more: by this many ranges of them
COMPACT_BYTES = 256 << 20  # a table is compacted (written again as few files) only up to this size
COMPACT_FILES = 8  # ... and only when it has more data files than this

# pyiceberg warns on a delete that removes nothing (a delete of keys the unit inserted only, a truncate of nothing)
warnings.filterwarnings("ignore", message="Delete operation did not match any records")


@dataclass
class Handle:
    """An Iceberg table as a unit or a read sees it: the table, the snapshot read (None: the current one, -1: none:
    the table empty as created) and, during a unit, the rows its checks read (:meth:`IcebergTarget.current_rows`)."""

    table: Table
    snapshot_id: int | None = None
    scope: BooleanExpression | None = None  # the rows of ``current``: the unit's scope (None: not read)
    current: pa.Table | None = None


class IcebergTarget(LakeTarget):
    kind = "iceberg"
    dialect = ICEBERG

    def __init__(self, name: str, location: str, catalog: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(name, location, **kwargs)
        self.catalog_props = dict(catalog or {})
        self._catalog: Any = None

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = open_catalog(self.name, self.root, self.catalog_props)
        return self._catalog

    def table(self, table: str) -> Table | None:
        """Source table ``table``'s Iceberg table (None: there is none)."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        with self._reading(table):
            try:
                return self.catalog.load_table(self.dialect.identifier(table))
            except (NoSuchTableError, NoSuchNamespaceError):
                return None

    def tables(self) -> dict[str, Table]:
        """The catalog's tables this mirrorline writes (their ``mirrorline.table`` property), by source table."""
        out: dict[str, Table] = {}
        with self._reading("(the catalog's tables)"):
            for ns in self.catalog.list_namespaces():
                for ident in self.catalog.list_tables(ns):
                    t = self.catalog.load_table(ident)
                    source = t.properties.get(TABLE_PROP)
                    if source and self.dialect.identifier(source) == tuple(ident):
                        out[source] = t
        return dict(sorted(out.items()))

    # -- the table format (LakeTarget) -----------------------------------------------------------------------------
    def open_table(self, table: str) -> Handle | None:
        t = self.table(table)
        return None if t is None else Handle(t)

    def table_positions(self) -> dict[str, Position]:
        return {source: table_position(t, self.name) for source, t in self.tables().items()}

    def table_position(self, handle: Handle) -> Position:
        return table_position(handle.table, self.name)

    def columns_of(self, handle: Handle) -> list[str]:
        return [f.name for f in handle.table.schema().fields]

    def current_rows(self, handle: Handle, ts: TableSchema, rows: dict[str, pa.Table]) -> pa.Table:
        """The table's rows in the unit's scope (:meth:`_key_filter` of every first key column value the unit's rows
        name): what its checks read, and what its commit deletes and writes back but for the keys it removes."""
        texts = [
            r[c]
            for k, cols in (("D", [key_col(0)]), ("U", [key_col(0)]), ("I", [ts.key[0], moved_col(0)]))
            for r in [rows.get(k)]
            if r is not None
            for c in cols
            if c in r.column_names
        ]
        values = pc.unique(pa.chunked_array([c.cast(pa.string()) for t in texts for c in t.chunks], pa.string()))
        scope = self._key_filter(ts, values)
        with self._reading(ts.table):
            data = handle.table.scan(row_filter=scope).to_arrow()
        handle.scope, handle.current = scope, data
        return data

    def _key_filter(self, ts: TableSchema, texts: pa.Array) -> BooleanExpression:
        """The rows whose first key column holds one of ``texts`` (PostgreSQL's text of the values; NULL: IS NULL):
        each value named (at most :data:`IN_KEYS`), else the rows between the least and the greatest of each of
        :data:`RANGES` runs of them in order, rows that the commit writes back when it keeps them. pyiceberg binds
        and evaluates a filter value by value in Python (a filter naming 200,000 keys cost 13 s of a commit, bound
        seven times); a range is one comparison, and lets it drop a data file inside it without reading it."""
        from pyiceberg.expressions import AlwaysFalse, And, GreaterThanOrEqual, In, IsNull, LessThanOrEqual, Or

        col = ts.column(ts.key[0])
        con = duck_connection()
        try:
            con.register("keys", pa.table({"k": texts}))
            typed = con.sql(
                f"SELECT DISTINCT {self.dialect.convert('k', ts, col)} AS k FROM keys WHERE k IS NOT NULL ORDER BY 1"
            ).to_arrow_table()["k"]
        finally:
            con.close()
        n = len(typed)
        name = col.name
        expr: BooleanExpression
        if n == 0:
            expr = AlwaysFalse()
        elif n <= IN_KEYS:
            expr = In(name, typed.to_pylist())
        else:
            runs = [(i * n // RANGES, (i + 1) * n // RANGES - 1) for i in range(RANGES)]
            parts = [
                And(GreaterThanOrEqual(name, typed[lo].as_py()), LessThanOrEqual(name, typed[hi].as_py()))
                for lo, hi in runs
                if hi >= lo
            ]
            expr = parts[0] if len(parts) == 1 else Or(*parts)
        if texts.null_count:
            expr = IsNull(name) if n == 0 else Or(expr, IsNull(name))
        return expr

    def batches(self, handle: Handle, columns: list[str]) -> Iterator[pa.RecordBatch]:
        if handle.snapshot_id == -1:
            return iter(())
        scan = handle.table.scan(selected_fields=tuple(columns), snapshot_id=handle.snapshot_id)
        return iter(scan.to_arrow_batch_reader())

    def as_of(self, table: str, handle: Handle, position: Position) -> Handle:
        """The table at its last snapshot by this target at or before ``position`` (snapshots of others, such as a
        compaction, change no rows; none: the table as created, empty)."""
        t = handle.table
        snap = t.current_snapshot()
        while snap is not None:
            pos = snapshot_position(snap, self.name)
            if pos is not None and pos <= position:
                return Handle(t, snap.snapshot_id)
            if snap.parent_snapshot_id is None:  # the first: the table was empty before it
                return Handle(t, -1)
            snap = t.snapshot_by_id(snap.parent_snapshot_id)
        if t.current_snapshot() is None:
            return Handle(t, -1)
        raise TargetError(
            f"target {self.name}: {table} is ahead of the target's position {position} and its snapshots no longer "
            "hold the one at that position",
            hint="run mirrorline again so that the target's position catches up with its tables, then verify",
            target=self.name,
            table=table,
        )

    def commit_rows(
        self, handle: Handle, ts: TableSchema, src: pa.Table, plan: Plan, truncated: bool, position: Position
    ) -> None:
        """One transaction: when the unit deletes, updates or replaces rows, the rows in its scope deleted
        (:meth:`current_rows`) and the ones it keeps written back; the new images appended (an update's unsent columns
        taken from the row it updates); the position set in the table's properties."""
        from pyiceberg.expressions import AlwaysTrue

        t = handle.table
        ops = src[OP_COL]
        props = {"mirrorline.target": self.name, "mirrorline.position": str(position)}
        schema = t.schema().as_arrow()
        bag = isinstance(plan, BagPlan)
        with t.transaction() as tx:
            if truncated:
                tx.delete(AlwaysTrue(), snapshot_properties=props)
                new = src.filter(pc.invert(pc.equal(ops, "D")))
            else:
                gone = src.filter(pc.is_in(ops, pa.array(["D"] if bag else ["D", "U", "R"])))
                new = src.filter(pc.is_in(ops, pa.array(["I"] if bag else ["U", "I", "R"])))
                if any(plan.masks) and new.num_rows:
                    new = self._completed(handle, ts, plan, new)
                if gone.num_rows:  # the unit's scope deleted, its rows but the ones removed written back
                    assert handle.scope is not None
                    tx.delete(handle.scope, snapshot_properties=props)
                    back = self._kept(handle, ts, gone)
                    if back.num_rows:
                        new = pa.concat_tables([fit(back, schema), fit(new, schema)])
            if new.num_rows:
                tx.append(fit(new, schema), snapshot_properties=props)
            tx.set_properties({POSITION_PROP + self.name: str(position)})

    def _kept(self, handle: Handle, ts: TableSchema, gone: pa.Table) -> pa.Table:
        """The rows in the unit's scope (:meth:`current_rows`) whose key ``gone`` does not remove (a bag's: whose
        image it does not)."""
        assert handle.current is not None
        if not handle.current.num_rows:
            return handle.current
        con = duck_connection()
        try:
            con.register("tgt", handle.current)
            con.register("gone", gone.select(list(ts.key)))
            same = " AND ".join(f"g.{quote_ident(k)} IS NOT DISTINCT FROM t.{quote_ident(k)}" for k in ts.key)
            return con.sql(
                f"SELECT t.* FROM tgt t WHERE NOT EXISTS (SELECT 1 FROM gone g WHERE {same})"
            ).to_arrow_table()
        finally:
            con.close()

    def _completed(self, handle: Handle, ts: TableSchema, plan: Plan, new: pa.Table) -> pa.Table:
        """``new`` with each update's unsent columns taken from the row it updates (the rows the checks read)."""
        assert handle.current is not None
        cols = list(ts.column_names)
        sets = ", ".join(
            f"({i}, [{', '.join(lit(c) for c in sorted(parse_mask(m)))}]::VARCHAR[])" for i, m in enumerate(plan.masks)
        )
        pick = ", ".join(
            f"CASE WHEN coalesce(list_contains(k.kept, {lit(c)}), false) THEN t.{quote_ident(c)} "
            f"ELSE n.{quote_ident(c)} END AS {quote_ident(c)}"
            for c in cols
        )
        on = " AND ".join(f"t.{quote_ident(k)} IS NOT DISTINCT FROM n.{quote_ident(k)}" for k in ts.key)
        con = duck_connection()
        try:
            con.register("tgt", handle.current)
            con.register("new", new)
            out = con.sql(
                f"SELECT {pick}, n.{OP_COL} FROM new n LEFT JOIN (VALUES {sets}) AS k(g, kept) ON k.g = n.{GROUP_COL} "
                f"LEFT JOIN tgt t ON coalesce(len(k.kept), 0) > 0 AND {on}"
            ).to_arrow_table()
        finally:
            con.close()
        return out

    # -- schema ----------------------------------------------------------------------------------------------------
    def reshape(self, ts: TableSchema, step: Step) -> str:
        """The table taken to ``step``'s shape in one commit by Iceberg's schema evolution: columns dropped, renamed
        (keeping their ids), added, and widened where Iceberg can; the rows written again (:meth:`rebuilt_rows`) only
        where a value changes (a type Iceberg cannot widen, a new column's value in existing rows)."""
        from pyiceberg.schema import promote

        assert step.shape is not None
        sources = dict(step.sources)
        with self._lock(ts.table):
            t = self.table(ts.table)
            assert t is not None
            old = {f.name: f for f in t.schema().fields}
            used = {s for s in sources.values() if s is not None}
            new_types = {
                c.name: self.dialect.iceberg_type(self.dialect.type_info(ts.table, c).target_type)
                for c in step.shape.columns
            }
            rewrite = False
            for c in step.shape.columns:
                src = sources.get(c.name)
                if src is None:
                    rewrite |= c.missing_value is not None
                elif old[src].field_type != new_types[c.name]:
                    try:
                        promote(old[src].field_type, new_types[c.name])
                    except Exception:
                        rewrite = True
            data = t.scan().to_arrow() if rewrite else None
            pos = table_position(t, self.name)
            with self._writing(ts.table, pos, redo=False), t.transaction() as tx:
                with tx.update_schema(allow_incompatible_changes=True) as u:
                    for name in old:
                        if name not in used:
                            u.delete_column((name,))
                    for c in step.shape.columns:
                        src = sources.get(c.name)
                        if src is not None and old[src].field_type != new_types[c.name]:
                            u.update_column((src,), field_type=new_types[c.name])
                    for c in step.shape.columns:
                        src = sources.get(c.name)
                        if src is not None and src != c.name:
                            u.rename_column((src,), c.name)
                    for c in step.shape.columns:
                        if sources.get(c.name) is None:
                            u.add_column((c.name,), new_types[c.name])
                if data is not None:
                    rows = self.rebuilt_rows(ts, step, data)
                    tx.overwrite(
                        rows, snapshot_properties={"mirrorline.target": self.name, "mirrorline.position": str(pos)}
                    )
        return f"{step.describe()} ({'rows written again' if rewrite else 'schema evolution'})"

    def recreate(self, schemas: Iterable[TableSchema]) -> None:
        self.ensure_schema(schemas)

    def ensure_schema(self, schemas: Iterable[TableSchema], record: bool = True) -> list[str]:
        """Create missing tables (and their namespaces) and add missing columns (a snapshot's shape, or a unit's
        columns added), and, with ``record``, record each as the shape its table has (what a snapshot loaded)."""
        schemas = list(schemas)
        shaped = [self.shape(ts) for ts in schemas]  # (a table kept with its history: with its columns)
        for ts in shaped:
            for c in ts.columns:
                self.dialect.type_info(ts.table, c)
        done: list[str] = []
        for ts in shaped:
            with self._writing(ts.table, ZERO, redo=False):
                t = self.table(ts.table)
                if t is None:
                    self._create(ts)
                    done.append(f"created {ts.table}")
                    self._lossy_note(ts)
                    continue
                have = {f.name for f in t.schema().fields}
                new = [c for c in ts.columns if c.name not in have]
                if new:
                    with t.update_schema() as u:
                        for c in new:
                            u.add_column(
                                (c.name,), self.dialect.iceberg_type(self.dialect.type_info(ts.table, c).target_type)
                            )
                    done.extend(f"added {ts.table}.{c.name}" for c in new)
        if record:
            with self.transaction() as s:
                ensure_state(s)
                for ts in schemas:
                    write_shape(s, ts, 0)
        return done

    def _create(self, ts: TableSchema) -> None:
        from pyiceberg.exceptions import TableAlreadyExistsError

        namespace, name = self.dialect.identifier(ts.table)
        self.catalog.create_namespace_if_not_exists((namespace,))
        location = None
        if not self.catalog_props:  # the embedded catalog: the files under the folder, in names any path can hold
            location = (self.root.resolve() / WAREHOUSE / folder_name(namespace) / folder_name(name)).as_uri()
        props = {
            TABLE_PROP: ts.table,
            "format-version": "2",
            "write.metadata.delete-after-commit.enabled": "true",
            "write.metadata.previous-versions-max": "50",
        }
        with contextlib.suppress(TableAlreadyExistsError):  # another process (a snapshot's load) created it first
            self.catalog.create_table(
                (namespace, name), self.dialect.arrow_schema(ts), location=location, properties=props
            )

    # -- writes ----------------------------------------------------------------------------------------------------
    def write(self, table: str, parts: Sequence[pa.Table], position: Position, overwrite: bool) -> None:
        """Add ``parts`` to the table's rows, or replace them (``overwrite``), in one commit carrying ``position``
        (a snapshot's load)."""
        from pyiceberg.expressions import AlwaysTrue

        t = self.table(table)
        if t is None:
            raise TargetError(f"target {self.name}: no Iceberg table for {table}", target=self.name, table=table)
        schema = t.schema().as_arrow()
        data = pa.concat_tables([fit(p, schema) for p in parts]) if parts else schema.empty_table()
        props = {"mirrorline.target": self.name, "mirrorline.position": str(position)}
        with self._lock(table), self._writing(table, position, redo=False), t.transaction() as tx:
            if overwrite:
                tx.delete(AlwaysTrue(), snapshot_properties=props)
            if data.num_rows:
                tx.append(data, snapshot_properties=props)
            tx.set_properties({POSITION_PROP + self.name: str(position)})

    @contextlib.contextmanager
    def _reading(self, table: str) -> Iterator[None]:
        """A catalog's or a file's failure while reading as the target's error."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            yield
        except (NoSuchTableError, NoSuchNamespaceError, TargetError):
            raise
        except (OSError, ValueError, pa.ArrowException) as e:
            raise TransientTargetError(
                f"target {self.name}: reading the Iceberg table {table} failed: {first_line(e)}",
                hint="check the target's folder (or catalog) and run again",
                target=self.name,
                table=table,
            ) from e

    @contextlib.contextmanager
    def _writing(self, table: str, end: Position, redo: bool = True) -> Iterator[None]:
        """A commit's failure as mirrorline's error: a commit that lost to another is redone (``redo``) or the
        target's transient error; a value Iceberg refuses is the data's (ApplyError); anything else the target's
        (nothing was committed either way)."""
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ValidationError

        ctx: dict[str, Any] = {"target": self.name, "table": table, "position": str(end)}
        try:
            yield
        except CommitFailedException as e:
            if redo:
                raise Conflict(first_line(e)) from e
            raise TransientTargetError(
                f"target {self.name}: another writer committed to the Iceberg table {table} first: {first_line(e)}",
                hint="nothing was committed; run again",
                **ctx,
            ) from e
        except CommitStateUnknownException as e:
            raise TransientTargetError(
                f"target {self.name}: the catalog did not say whether the commit to {table} landed: {first_line(e)}",
                hint="run again: the table's position says whether the unit is there, and it is applied once",
                **ctx,
            ) from e
        except (ApplyError, TargetError, Conflict):
            raise
        except ValidationError as e:
            raise ApplyError(
                f"target {self.name}: the Iceberg table {table} cannot take the unit up to {end}: {first_line(e)}",
                hint="change the table at the target (or the source's column) and run again",
                db_message=first_line(e),
                **ctx,
            ) from e
        except (OSError, ValueError, TypeError, pa.ArrowException) as e:
            cls = TransientTargetError if isinstance(e, OSError) else TargetError
            raise cls(
                f"target {self.name}: writing the Iceberg table {table} failed: {type(e).__name__}: {first_line(e)}",
                hint="nothing was committed to this table; check the target's folder (or catalog) and run again",
                **ctx,
            ) from e

    # -- upkeep ----------------------------------------------------------------------------------------------------
    def maintain(self, *, retention_hours: int = 168, compact: bool = True, vacuum: bool = True) -> dict[str, Any]:
        """Per table: its data files written again as few (when it has more than :data:`COMPACT_FILES` and is at
        most :data:`COMPACT_BYTES`: one commit, no row changed, the position kept), snapshots older than
        ``retention_hours`` expired (the current one is kept), and files no snapshot reads that are older than that
        removed (orphans: a commit that failed half-way)."""
        out: dict[str, Any] = {}
        for source in self.tables():
            entry: dict[str, Any] = {}
            with self._writing(source, ZERO, redo=False):
                if compact:
                    entry["compacted"] = self._compact(source)
                if vacuum:
                    entry["expired"] = self._expire(source, retention_hours)
                    entry["orphans_removed"] = self._remove_orphans(source, retention_hours)
            out[source] = entry
        return out

    def _compact(self, source: str) -> dict[str, Any]:
        from pyiceberg.exceptions import CommitFailedException

        with self._lock(source):
            t = self.table(source)
            assert t is not None
            files = [task.file for task in t.scan().plan_files()]
            size = sum(f.file_size_in_bytes for f in files)
            if (
                len(files) <= COMPACT_FILES
                or size > COMPACT_BYTES
                or any(task.delete_files for task in t.scan().plan_files())
            ):
                return {
                    "files": len(files),
                    "bytes": size,
                    "skipped": "few files" if len(files) <= COMPACT_FILES else "large",
                }
            data = t.scan().to_arrow()
            pos = table_position(t, self.name)
            try:
                t.overwrite(data, snapshot_properties={"mirrorline.target": self.name, "mirrorline.position": str(pos)})
            except CommitFailedException as e:  # another writer first: at the next round
                return {"skipped": first_line(e)}
            t.refresh()
            return {"removed": len(files), "added": len(list(t.scan().plan_files()))}

    def _expire(self, source: str, retention_hours: int) -> int:
        with self._lock(source):
            t = self.table(source)
            assert t is not None
            before = len(t.snapshots())
            cut = dt.datetime.now(dt.UTC) - dt.timedelta(hours=retention_hours)
            t.maintenance.expire_snapshots().older_than(cut).commit()
            t.refresh()
            return before - len(t.snapshots())

    def _remove_orphans(self, source: str, retention_hours: int) -> int:
        """Files under the table's folder that no snapshot, manifest or metadata file names, older than the
        retention (a newer one may be a commit under way)."""
        t = self.table(source)
        assert t is not None
        root = _local(t.location())
        if root is None or not root.is_dir():
            return 0  # a remote warehouse: its own catalog's upkeep
        named = {t.metadata_location}
        named.update(e.metadata_file for e in t.metadata.metadata_log)
        for snap in t.snapshots():
            named.add(snap.manifest_list)
            for m in snap.manifests(t.io):
                named.add(m.manifest_path)
                named.update(e.data_file.file_path for e in m.fetch_manifest_entry(t.io, discard_deleted=False))
        keep = {p for p in (_local(n) for n in named) if p is not None}
        cut = time.time() - retention_hours * 3600
        removed = 0
        for dirpath, _, files in os.walk(root):
            for f in files:
                p = Path(dirpath) / f
                if p not in keep and p.stat().st_mtime < cut:
                    p.unlink()
                    removed += 1
        return removed

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per table: its current snapshot, data and delete files, and the position its last commit applied."""
        out = {}
        for source, t in self.tables().items():
            tasks = list(t.scan().plan_files())
            snap = t.current_snapshot()
            out[source] = {
                "snapshot": snap.snapshot_id if snap else None,
                "data_files": len(tasks),
                "delete_files": len({d.file_path for task in tasks for d in task.delete_files}),
                "position": str(table_position(t, self.name)),
            }
        return out

    def close(self) -> None:
        super().close()
        engine = getattr(self._catalog, "engine", None)
        if engine is not None:
            engine.dispose()
        self._catalog = None


def _local(uri: str) -> Path | None:
    """A ``file:`` URI (or a plain path) as a path (None: another scheme)."""
    u = urlparse(uri)
    if u.scheme in ("", "file"):
        return Path(unquote(u.path))
    return None
