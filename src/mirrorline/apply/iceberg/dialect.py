"""An Iceberg target's names, types and catalog: the dialect (PostgreSQL types as Iceberg's, written as Arrow's), a
table's identifier and files' folder, the catalog a target's configuration names, and the table's position in its
properties."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from mirrorline.apply.lake.dialect import LakeDialect
from mirrorline.errors import TargetError, first_line
from mirrorline.model import split_table_name
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.types import PrimitiveType

CATALOG_FILE = "_catalog.sqlite"  # the embedded catalog's SQLite file, in the target's folder
WAREHOUSE = "warehouse"  # the embedded catalog's table files, beside it
TABLE_PROP = "mirrorline.table"  # the source table an Iceberg table replicates
POSITION_PROP = "mirrorline.position."  # + the target's name: what the table's last commit by that target applied

# Iceberg's types -> (DuckDB type its text is cast to, Arrow type written)
TYPES: dict[str, tuple[str, pa.DataType]] = {
    "int": ("INTEGER", pa.int32()),
    "long": ("BIGINT", pa.int64()),
    "float": ("REAL", pa.float32()),
    "double": ("DOUBLE", pa.float64()),
    "boolean": ("BOOLEAN", pa.bool_()),
    "date": ("DATE", pa.date32()),
    "timestamp": ("TIMESTAMP", pa.timestamp("us")),
    "timestamptz": ("TIMESTAMPTZ", pa.timestamp("us", tz="UTC")),
    "binary": ("BLOB", pa.binary()),
    "string": ("VARCHAR", pa.string()),
}
INTS = {"smallint": "int", "integer": "int", "bigint": "long", "oid": "long"}  # Iceberg has no 16-bit integer
FLOATS = {"real": "float", "double precision": "double"}
TIMES = {
    "date": "date",
    "timestamp without time zone": "timestamp",
    "timestamp": "timestamp",
    "timestamp with time zone": "timestamptz",
    "timestamptz": "timestamptz",
}


class IcebergDialect(LakeDialect):
    """The Iceberg target's dialect: the table formats' type mapping in Iceberg's type names (Iceberg has no 16-bit
    integer: a ``smallint`` is an ``int``), and a table's identifier in the catalog."""

    name = "iceberg"
    title = "Iceberg"
    types = TYPES
    ints, floats, times = INTS, FLOATS, TIMES
    zoned = frozenset({"timestamptz"})

    def identifier(self, table: str) -> tuple[str, str]:
        """``sales.orders`` -> namespace ``sales``, table ``orders``: the source's names as they are (quotes, spaces,
        capitals, dots in the table's name)."""
        return split_table_name(table)

    def iceberg_type(self, target_type: str) -> PrimitiveType:
        """One of this dialect's type names as pyiceberg's type."""
        from pyiceberg import types as t

        if target_type.startswith("decimal("):
            p, s = (int(x) for x in target_type[len("decimal(") : -1].split(","))
            return t.DecimalType(p, s)
        return {
            "int": t.IntegerType(),
            "long": t.LongType(),
            "float": t.FloatType(),
            "double": t.DoubleType(),
            "boolean": t.BooleanType(),
            "date": t.DateType(),
            "timestamp": t.TimestampType(),
            "timestamptz": t.TimestamptzType(),
            "binary": t.BinaryType(),
            "string": t.StringType(),
        }[target_type]


ICEBERG = IcebergDialect()


def folder_name(part: str) -> str:
    """A name as one path segment of a table's files: letters, digits, ``_`` and ``-`` as they are, every other
    character ``~`` and its UTF-8 bytes in hex (distinct names stay distinct; nothing a URL or path gives meaning
    to)."""
    return "".join(
        ch if (ch.isascii() and ch.isalnum()) or ch in "_-" else "~" + ch.encode().hex().upper() for ch in part
    )


def catalog_properties(root: Path, given: Mapping[str, str] | None) -> dict[str, str]:
    """The properties of the target's catalog: ``given`` (a ``[targets.X.catalog]`` table), else the embedded one
    (pyiceberg's SQL catalog in ``_catalog.sqlite`` in the target's folder, its tables' files under
    ``warehouse/``)."""
    if given:
        return dict(given)
    root = root.resolve()  # (a file URI names an absolute path)
    return {
        "type": "sql",
        "uri": f"sqlite:///{root / CATALOG_FILE}",
        "warehouse": (root / WAREHOUSE).as_uri(),
    }


def open_catalog(target: str, root: Path, given: Mapping[str, str] | None) -> Catalog:
    """The target's catalog (its properties' values never appear in an error: they may hold credentials)."""
    from pyiceberg.catalog import load_catalog

    props = catalog_properties(root, given)
    if not given:
        root.mkdir(parents=True, exist_ok=True)
    try:
        return load_catalog("mirrorline", **props)
    except Exception as e:  # pyiceberg raises its own, requests' and SQLAlchemy's errors here
        where = "the embedded catalog in " + str(root / CATALOG_FILE) if not given else "the catalog its table names"
        raise TargetError(
            f"target {target}: cannot open {where}: {type(e).__name__}: {_redact(first_line(e), props)}",
            hint="check the target's [catalog] table (uri, warehouse, credentials) and that the catalog is up",
            target=target,
        ) from e


def _redact(text: str, props: Mapping[str, str]) -> str:
    for key, value in props.items():
        if value and key not in ("type", "uri", "warehouse") and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def table_position(table: Table, target: str) -> Position:
    """What the table's last commit by ``target`` applied (ZERO: none yet)."""
    text = table.properties.get(POSITION_PROP + target)
    return Position.parse(text) if text else ZERO


def snapshot_position(snapshot: Any, target: str) -> Position | None:
    """The position a snapshot's commit by ``target`` applied (None: another writer's snapshot)."""
    summary = snapshot.summary
    if summary is None or summary["mirrorline.target"] != target:
        return None
    text = summary["mirrorline.position"]
    return Position.parse(text) if text else None
