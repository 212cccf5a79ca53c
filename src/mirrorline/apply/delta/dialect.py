"""A Delta target's names, types and commits: the dialect (PostgreSQL types as Arrow's), a table's folder, its
position in its Delta commits."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirrorline.apply.lake.dialect import LOCK_FILE, STATE_FILE, LakeDialect
from mirrorline.errors import TargetError, first_line
from mirrorline.model import split_table_name
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)


class DeltaDialect(LakeDialect):
    """The Delta target's dialect: the table formats' type mapping (:class:`~mirrorline.apply.lake.dialect.LakeDialect`,
    in Delta's type names) and a table's folder."""

    name = "delta"
    title = "Delta"

    def table_dir(self, root: Path, table: str) -> Path:
        """``public.orders`` -> ``orders``; ``sales.orders`` (and a public name holding a dot) -> ``schema.name``.
        A name never leaves the folder or meets mirrorline's own files: ``/``, ``\\``, ``%``, ``~`` and a leading dot
        (``..``) are written ``~XX`` (their code in hex), and so is a dot in the schema and a name that is one of this
        folder's own files."""
        schema, name = split_table_name(table)
        if schema == "public" and "." not in name:
            return root / _folder_part(name)
        return root / f"{_folder_part(schema).replace('.', '~2E')}.{_folder_part(name)}"


DELTA = DeltaDialect()


def commit_properties(target: str, position: Position) -> Any:
    """A commit carrying the target's position: two application transactions and the commit's metadata."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        custom_metadata={"mirrorline.target": target, "mirrorline.position": str(position)},
        app_transactions=[Transaction(target, position.lsn), Transaction(f"{target}.seq", position.seq)],
    )


def table_position(dt: DeltaTable, target: str) -> Position:
    """What the table's last commit by ``target`` applied (ZERO: none yet)."""
    lsn = dt.transaction_version(target)
    if lsn is None:
        return ZERO
    return Position(int(lsn), int(dt.transaction_version(f"{target}.seq") or 0))


def _open(path: Path) -> DeltaTable | None:
    """The Delta table in ``path`` (None: there is none); one whose log cannot be read is a TargetError."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        return DeltaTable(str(path)) if DeltaTable.is_deltatable(str(path)) else None
    except (DeltaError, OSError) as e:
        raise TargetError(
            f"cannot read the Delta table in {path}: {first_line(e)}",
            hint="repair the table (or move the folder away and snapshot the table again)",
            path=str(path),
        ) from e


def _folder_part(part: str) -> str:
    # escaped as ~XX (delta-rs decodes %XX in a path): ~, /, \\, NUL, a leading dot, and this folder's own files
    out = "".join(f"~{ord(ch):02X}" if ch in "~/\\\x00%" else ch for ch in part)
    if out.startswith("."):
        out = "~2E" + out[1:]
    if out in (STATE_FILE, LOCK_FILE):
        out = "~5F" + out[1:]
    return out


def _unescape(part: str) -> str:
    return re.sub(r"~([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), part)


def _table_of(folder: str) -> str:
    """The source table whose Delta table is in ``folder`` (the inverse of :meth:`DeltaDialect.table_dir`)."""
    if "." not in folder:
        return f"public.{_unescape(folder)}"
    schema, name = folder.split(".", 1)
    return f"{_unescape(schema)}.{_unescape(name)}"
