"""Targets stopped by an error, recorded beside the log (``<log>/stopped/<target>.json``) by the process that applied
to them, so that ``status`` (another process, later) reports them, and exits 1, until the target applies a unit again.
And configured tables that no longer exist at the source under their name (dropped or renamed there),
recorded by capture (``<log>/stopped/tables/<table>.json``): no change of theirs comes any more, the other tables go
on, and ``status`` names them until the configuration no longer does. Pure file I/O; a record is replaced
atomically."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from mirrorline.errors import first_line

FOLDER = "stopped"


def _path(log_root: Path, target: str) -> Path:
    return log_root / FOLDER / f"{target}.json"


def record(log_root: Path, target: str, error: BaseException, position: str) -> None:
    """``target`` stopped on ``error`` while applying the unit ending at ``position``."""
    text = first_line(error)
    doc = {
        "target": target,
        "error": text,
        "kind": type(error).__name__,
        "position": position,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    _write(_path(log_root, target), doc)


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def clear(log_root: Path, target: str) -> None:
    _path(log_root, target).unlink(missing_ok=True)


def read(log_root: Path) -> dict[str, dict[str, Any]]:
    """Every target's record, by target name (a record that cannot be read is reported as such)."""
    folder = log_root / FOLDER
    out: dict[str, dict[str, Any]] = {}
    if not folder.is_dir():
        return out
    for p in sorted(folder.glob("*.json")):
        try:
            out[p.stem] = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            out[p.stem] = {"target": p.stem, "error": f"unreadable stop record {p}: {e}", "position": "", "at": ""}
    return out


TABLES = "tables"


def record_table(log_root: Path, table: str, reason: str, position: str) -> None:
    """Capture found that the configured ``table`` no longer exists at the source (``reason``: what happened) at
    ``position``. Kept as first recorded."""
    path = log_root / FOLDER / TABLES / f"{quote(table, safe='')}.json"
    if path.exists():
        return
    doc = {
        "table": table,
        "reason": reason,
        "position": position,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    _write(path, doc)


def tables(log_root: Path) -> dict[str, dict[str, Any]]:
    """Every table recorded as gone from the source, by name."""
    folder = log_root / FOLDER / TABLES
    out: dict[str, dict[str, Any]] = {}
    if not folder.is_dir():
        return out
    for p in sorted(folder.glob("*.json")):
        name = unquote(p.stem)
        try:
            out[name] = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            out[name] = {"table": name, "reason": f"unreadable record {p}: {e}", "position": "", "at": ""}
    return out


def clear_table(log_root: Path, table: str) -> bool:
    """``table`` exists at the source under its name again (created again, or renamed back): its record goes.
    Returns whether there was one."""
    path = log_root / FOLDER / TABLES / f"{quote(table, safe='')}.json"
    if not path.exists():
        return False
    path.unlink(missing_ok=True)
    return True
