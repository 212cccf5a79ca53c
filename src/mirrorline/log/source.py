"""The source a log is fed from, as the log records it (``<log>/source.json``): the source's system identifier,
timeline and database, and the slot. Capture writes it and judges every start against it
(:mod:`mirrorline.capture.identity`); an import and a snapshot export read it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mirrorline.log.layout import read_json, write_json_atomic

FILE = "source.json"


@dataclass(frozen=True)
class SourceIdentity:
    system_identifier: str
    timeline: int
    database: str
    slot: str


def read(log_root: Path) -> SourceIdentity | None:
    """The source the log at ``log_root`` is fed from (None: not recorded, or no log)."""
    p = log_root / FILE
    if not p.is_file():
        return None
    d = read_json(p)
    return SourceIdentity(str(d["system_identifier"]), int(d["timeline"]), str(d["database"]), str(d["slot"]))


def write(log_root: Path, ident: SourceIdentity) -> None:
    """Record the source the log is fed from (atomically)."""
    log_root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(log_root / FILE, {**asdict(ident), "recorded_at": time.time()})
