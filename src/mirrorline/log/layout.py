"""Where the change log keeps what, and how a file becomes visible atomically.

::

    <root>/segments/{first_lsn:016X}-{last_lsn:016X}.parquet   ordinary segments: whole transactions, commit order
    <root>/segments/{lsn:016X}-{lsn:016X}.stream/              a committed streamed transaction (parts + commit.json)
    <root>/spill/<xid>/                                        a streamed transaction still in progress
    <root>/schemas/<table>@<version>.json                      every version of every table's schema
    <root>/readers/<name>.json                                 each registered reader's applied position
    <root>/retained.json                                       the log starts after this position (set by retention)
    <root>/writer.lock                                         held (fcntl) by the one writer

Sorting segment names gives log order (fixed-width hex). Anything whose name starts with ``.`` is a temporary file
of a writer and is never read. Everything becomes visible by write, fsync, rename, fsync of the folder.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorline.errors import LogError
from mirrorline.log.stats import Stats
from mirrorline.log.stats import from_meta as stats_from_meta
from mirrorline.log.stats import to_meta as stats_to_meta
from mirrorline.position import Position

FORMAT = 1
META_KEY = b"mirrorline"  # Parquet footer key holding a segment's metadata (JSON)
COMMIT_RECORD = "commit.json"  # a stream folder's commit record
_SEGMENT_RE = re.compile(r"^([0-9A-F]{16})-([0-9A-F]{16})\.(parquet|stream)$")


def segment_name(first_lsn: int, last_lsn: int, stream: bool = False) -> str:
    return f"{first_lsn:016X}-{last_lsn:016X}.{'stream' if stream else 'parquet'}"


def parse_segment_name(name: str) -> tuple[int, int, bool] | None:
    """``(first_lsn, last_lsn, is_stream)`` for a segment name, ``None`` for anything else (temp files...)."""
    m = _SEGMENT_RE.match(name)
    if not m:
        return None
    return int(m.group(1), 16), int(m.group(2), 16), m.group(3) == "stream"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What a reader needs to know about a segment without reading its rows."""

    name: str
    path: Path
    stream: bool
    first: Position  # position of its first change
    last: Position  # position of its last change
    count: int  # number of changes
    min_ts: int  # smallest / largest commit timestamp in it (microseconds)
    max_ts: int
    prev: Position | None  # last position of the segment before it when it was written (None: it was the first)
    parts: tuple[str, ...] = ()  # stream segments: the part files, in the order written
    xid: int = 0  # stream segments: the transaction id
    # per-table statistics (mirrorline.log.stats); None in segments written before there were any
    tables: Stats | None = field(default=None, compare=False)
    # a segment of ``log import``: the (_c, _s) address of the last daystream line imported into it
    imported: tuple[int, int] | None = None

    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "first": [self.first.lsn, self.first.seq],
            "last": [self.last.lsn, self.last.seq],
            "count": self.count,
            "min_ts": self.min_ts,
            "max_ts": self.max_ts,
            "prev": [self.prev.lsn, self.prev.seq] if self.prev is not None else None,
            "parts": list(self.parts),
            "xid": self.xid,
            **({"tables": stats_to_meta(self.tables)} if self.tables is not None else {}),
            **({"imported": list(self.imported)} if self.imported is not None else {}),
        }

    @classmethod
    def from_meta(cls, name: str, path: Path, stream: bool, meta: dict[str, Any]) -> SegmentInfo:
        prev = meta.get("prev")
        return cls(
            name=name,
            path=path,
            stream=stream,
            first=Position(*meta["first"]),
            last=Position(*meta["last"]),
            count=int(meta["count"]),
            min_ts=int(meta["min_ts"]),
            max_ts=int(meta["max_ts"]),
            prev=Position(*prev) if prev is not None else None,
            parts=tuple(meta.get("parts") or ()),
            xid=int(meta.get("xid") or 0),
            tables=stats_from_meta(meta["tables"]) if meta.get("tables") is not None else None,
            imported=(int(meta["imported"][0]), int(meta["imported"][1])) if meta.get("imported") else None,
        )


class Layout:
    """The paths of one log root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.segments = self.root / "segments"
        self.spill = self.root / "spill"
        self.schemas = self.root / "schemas"
        self.readers = self.root / "readers"
        self.retained = self.root / "retained.json"
        self.lock = self.root / "writer.lock"

    def create(self) -> None:
        for d in (self.root, self.segments, self.spill, self.schemas, self.readers):
            d.mkdir(parents=True, exist_ok=True)

    def exists(self) -> bool:
        return self.segments.is_dir()

    def require(self) -> None:
        if not self.exists():
            raise LogError(
                f"no change log at {self.root}",
                hint="check [log] path, or start capture/import first",
                root=str(self.root),
            )


def temp_path(folder: Path, suffix: str = "") -> Path:
    """A temporary name in ``folder`` that readers ignore (leading dot)."""
    return folder / f".tmp-{uuid.uuid4().hex}{suffix}"


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Make ``tmp`` (already written and fsynced) visible as ``final`` atomically and durably."""
    os.replace(tmp, final)
    fsync_path(final.parent)


def write_atomic(path: Path, data: bytes) -> None:
    """Write a small file so that readers see the old content or the new one, never a part."""
    tmp = temp_path(path.parent, ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    publish(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LogError(
            f"cannot read {path}: {e}", hint="the change log is damaged; restore it or rebuild it", path=str(path)
        ) from None
