"""Targets stopped by an error, recorded beside the log (``<log>/stopped/<target>.json``) by the process that applied
to them, so that ``status`` (another process, later) reports them, and exits 1, until the target applies a unit again.
Pure file I/O; a record is replaced atomically."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FOLDER = "stopped"


def _path(log_root: Path, target: str) -> Path:
    return log_root / FOLDER / f"{target}.json"


def record(log_root: Path, target: str, error: BaseException, position: str) -> None:
    """``target`` stopped on ``error`` while applying the unit ending at ``position``."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    doc = {
        "target": target,
        "error": text,
        "kind": type(error).__name__,
        "position": position,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    path = _path(log_root, target)
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
