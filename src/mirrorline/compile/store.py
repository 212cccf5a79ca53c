"""Compiled units of work, kept so that one compiled unit serves every target (DESIGN §5: the output of a unit
does not depend on the target).

A unit ``(start, end]`` is stored under ``<log>/compiled/<start>_<end>/`` as the net rows (Parquet, written by Spark
in parallel) and a ``unit.json`` holding its tables in first-seen order, its truncates, its change count and how many
net rows its files hold. A unit becomes visible atomically: written under a temporary name, every file synced, then
renamed. One whose files do not hold those rows (damaged, or cut short by a crash of the machine) is not used: it is
removed and compiled again (:class:`Damaged`). Units every target has passed are pruned.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirrorline.compile.batch import NET_DDL, NetBatch
from mirrorline.log.layout import fsync_path
from mirrorline.position import Position

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

META = "unit.json"
STALE_SECONDS = 3600.0


def _name(start: Position, end: Position) -> str:
    return f"{start.lsn:016X}.{start.seq:010d}_{end.lsn:016X}.{end.seq:010d}"


def _parse(name: str) -> tuple[Position, Position] | None:
    try:
        a, b = name.split("_")
        (al, as_), (bl, bs) = a.split("."), b.split(".")
        return Position(int(al, 16), int(as_)), Position(int(bl, 16), int(bs))
    except ValueError:
        return None


class Damaged(Exception):
    """A stored unit whose files do not hold what its ``unit.json`` says: compile it again."""


def _net_files(net: Path) -> list[Path]:
    return sorted(p for p in net.iterdir() if p.name.endswith(".parquet") and not p.name.startswith("."))


def _rows(net: Path) -> int:
    """The net rows the unit's Parquet files hold, from their footers (no data read)."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in _net_files(net))


class UnitStore:
    def __init__(self, log_root: str | os.PathLike[str]) -> None:
        self.root = Path(log_root) / "compiled"

    def path(self, start: Position, end: Position) -> Path:
        return self.root / _name(start, end)

    def units(self) -> list[tuple[Position, Position]]:
        if not self.root.is_dir():
            return []
        found = [_parse(p.name) for p in self.root.iterdir() if (p / META).is_file()]
        return sorted(u for u in found if u is not None)

    def starting_at(self, start: Position) -> tuple[Position, Position] | None:
        """A stored unit that begins right after ``start``, if any (the longest)."""
        matches = [u for u in self.units() if u[0] == start]
        return matches[-1] if matches else None

    def load(self, spark: SparkSession, start: Position, end: Position) -> NetBatch:
        """The stored unit; :class:`Damaged` (and the unit removed) when its files do not hold its rows."""
        path = self.path(start, end)
        try:
            meta: dict[str, Any] = json.loads((path / META).read_text())
            if "net_rows" in meta and _rows(path / "net") != int(meta["net_rows"]):
                raise ValueError(f"its files hold {_rows(path / 'net')} net rows, not {meta['net_rows']}")
        except (OSError, ValueError, KeyError) as e:
            shutil.rmtree(path, ignore_errors=True)
            raise Damaged(f"stored unit {start}..{end} is damaged ({e}): it is compiled again") from e
        try:
            net = spark.read.schema(NET_DDL).parquet(str(path / "net"))
        except Exception as e:
            if (path / META).is_file():
                raise
            # pruned by another process between the two reads (it had passed the unit): compile it
            raise Damaged(f"stored unit {start}..{end} was removed meanwhile: it is compiled again") from e
        return NetBatch(
            start=start,
            end=end,
            tables=list(meta["tables"]),
            net=net,
            truncated={t: Position.parse(p) for t, p in meta["truncated"].items()},
            changes=int(meta["changes"]),
        )

    def save(self, spark: SparkSession, batch: NetBatch) -> NetBatch:
        """Write the unit (atomically visible) and return it read back from the store."""
        final = self.path(batch.start, batch.end)
        if (final / META).is_file():
            try:
                return self.load(spark, batch.start, batch.end)
            except Damaged:  # (removed: written again below)
                pass
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        batch.frame(spark).write.mode("overwrite").parquet(str(tmp / "net"))
        for part in _net_files(tmp / "net"):
            fsync_path(part)
        fsync_path(tmp / "net")
        meta = {
            "start": str(batch.start),
            "end": str(batch.end),
            "tables": batch.tables,
            "truncated": {t: str(p) for t, p in batch.truncated.items()},
            "changes": batch.changes,
            "net_rows": _rows(tmp / "net"),
        }
        with open(tmp / META, "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_path(tmp)
        try:
            os.rename(tmp, final)
            fsync_path(self.root)
        except OSError:  # another process stored the same unit first
            shutil.rmtree(tmp, ignore_errors=True)
        batch.release()
        return self.load(spark, batch.start, batch.end)

    def prune(self, applied: Position) -> int:
        """Remove units every target has passed (end <= ``applied``) and leftovers of interrupted writes."""
        removed = 0
        if not self.root.is_dir():
            return 0
        for p in self.root.iterdir():
            if p.name.startswith(".tmp-"):
                # an interrupted write; another process's write in progress is younger than this
                if time.time() - p.stat().st_mtime > STALE_SECONDS:
                    shutil.rmtree(p, ignore_errors=True)
                continue
            u = _parse(p.name)
            if u is not None and u[1] <= applied:
                shutil.rmtree(p, ignore_errors=True)
                removed += 1
        return removed
