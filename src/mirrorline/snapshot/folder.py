"""An exported snapshot folder (DESIGN §7, 001_ba158ba2f1493fda.txt "manual file based transfer"):

::

    <DIR>/<timestamp>/                   uniquely named (a UTC timestamp to the microsecond)
        0000-000000-public.items.csv     chunk files: sorting their names gives the load order
        0001-000000-public.orders.csv    each begins with a line naming its export, table and chunk
        manifest.json                    export id, source, consistent point, tables, schemas, chunks (rows,
                                         bytes, SHA-256)
        END                              the end marker, written last: the export id and the manifest's SHA-256

:func:`check_folder` checks all of it before anything is loaded, and refuses with a message naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mirrorline.errors import SnapshotError
from mirrorline.log.layout import write_atomic
from mirrorline.log.schemas import schema_from_json, schema_to_json
from mirrorline.model import TableSchema
from mirrorline.position import Position
from mirrorline.snapshot.plan import parse_chunk_file_name, parse_chunk_header
from mirrorline.snapshot.tasks import file_sha256

FORMAT = 1
MANIFEST = "manifest.json"
END = "END"


def make_folder(parent: str | os.PathLike[str]) -> Path:
    """A new, uniquely named folder in ``parent`` (which must exist)."""
    base = Path(parent)
    if not base.is_dir():
        raise SnapshotError(
            f"{base} is not a folder", hint="create it first, or pass an existing folder", path=str(base)
        )
    for _ in range(100):
        name = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        try:
            (base / name).mkdir()
            return base / name
        except FileExistsError:
            continue
    raise SnapshotError(f"cannot make a new folder in {base}", path=str(base))


@dataclass(frozen=True)
class ChunkEntry:
    file: str
    table: str
    chunk: int
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    export_id: str
    created: str
    source: dict[str, Any]
    consistent_lsn: int
    position: Position
    end_lsn: int
    tables: list[TableSchema]  # in load order
    chunks: list[ChunkEntry]  # in load order (sorted file names)

    def rows(self) -> dict[str, int]:
        out = {t.table: 0 for t in self.tables}
        for c in self.chunks:
            out[c.table] += c.rows
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "export": self.export_id,
            "created": self.created,
            "source": self.source,
            "consistent_lsn": self.consistent_lsn,
            "position": [self.position.lsn, self.position.seq],
            "position_text": str(self.position),
            "end_lsn": self.end_lsn,
            "tables": [{"schema": schema_to_json(t), "rows": self.rows()[t.table]} for t in self.tables],
            "chunks": [c.__dict__ for c in self.chunks],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        return cls(
            export_id=str(d["export"]),
            created=str(d.get("created", "")),
            source=dict(d.get("source") or {}),
            consistent_lsn=int(d["consistent_lsn"]),
            position=Position(int(d["position"][0]), int(d["position"][1])),
            end_lsn=int(d.get("end_lsn", 0)),
            tables=[schema_from_json(t["schema"]) for t in d["tables"]],
            chunks=[
                ChunkEntry(
                    str(c["file"]), str(c["table"]), int(c["chunk"]), int(c["rows"]), int(c["bytes"]), str(c["sha256"])
                )
                for c in d["chunks"]
            ],
        )


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """The manifest, then the end marker (each atomically): a folder without END is an incomplete export."""
    data = (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode()
    write_atomic(folder / MANIFEST, data)
    end = {"export": manifest.export_id, "manifest_sha256": hashlib.sha256(data).hexdigest()}
    write_atomic(folder / END, (json.dumps(end) + "\n").encode())


def _refuse(folder: Path, what: str, hint: str | None = None) -> SnapshotError:
    return SnapshotError(
        f"snapshot folder {folder}: {what}; nothing was loaded",
        hint=hint or "export it again, or copy the whole folder again",
        path=str(folder),
    )


def check_folder(folder: str | os.PathLike[str]) -> Manifest:
    """Everything about an exported folder, checked before anything is loaded: the end marker, the manifest, and
    every chunk (present, of this export, whole, unchanged) with no chunk that does not belong."""
    f = Path(folder)
    if not f.is_dir():
        raise SnapshotError(
            f"no snapshot folder at {f}", hint="pass the folder that snapshot export created", path=str(f)
        )
    if not (f / END).is_file():
        inside = sorted(p.name for p in f.iterdir() if p.is_dir() and (p / END).is_file())
        if inside:
            raise SnapshotError(
                f"{f} is not an export folder but holds {len(inside)}: {', '.join(inside)} (snapshot export DIR "
                "writes each export into a folder of its own inside DIR)",
                hint=f"pass one of them, e.g. {f / inside[-1]}",
                path=str(f),
            )
        raise _refuse(f, "the end marker END is missing: the export did not finish, or the folder was not copied whole")
    if not (f / MANIFEST).is_file():
        raise _refuse(f, f"{MANIFEST} is missing")
    data = (f / MANIFEST).read_bytes()
    try:
        end = json.loads((f / END).read_text())
        manifest = Manifest.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise _refuse(f, f"the manifest or end marker is damaged ({e})") from None
    if end.get("manifest_sha256") != hashlib.sha256(data).hexdigest() or end.get("export") != manifest.export_id:
        raise _refuse(f, "the manifest does not match the end marker (damaged, or from another export)")
    tables = {t.table for t in manifest.tables}
    for c in manifest.chunks:
        if parse_chunk_file_name(c.file) is None or Path(c.file).name != c.file or c.file in (".", ".."):
            raise _refuse(
                f,
                f"the manifest names a chunk {c.file!r}, which is not a chunk file of this folder (chunks are named "
                "NNNNN-NNNNN-<table>.csv, inside it)",
                hint="the manifest was edited: export again",
            )
        if c.table not in tables:
            raise _refuse(f, f"the manifest names chunk {c.file} of {c.table}, a table it does not describe")
    listed = {c.file: c for c in manifest.chunks}
    for name in sorted(os.listdir(f)):
        if parse_chunk_file_name(name) and name not in listed:
            raise _refuse(
                f,
                f"chunk {name} is not part of export {manifest.export_id}",
                hint="remove it, or copy the right folder",
            )
    for c in manifest.chunks:
        p = f / c.file
        if not p.is_file():
            raise _refuse(f, f"chunk {c.file} is missing")
        with open(p, "rb") as fh:
            first = fh.readline(4096).decode("utf-8", "replace")
        header = parse_chunk_header(first)
        if header is None:
            raise _refuse(f, f"chunk {c.file} is damaged (no chunk header)")
        if header["export"] != manifest.export_id:
            raise _refuse(
                f,
                f"chunk {c.file} belongs to export {header['export']}, not {manifest.export_id}",
                hint="copy the chunk from the right export folder",
            )
        if header["table"] != c.table or header["chunk"] != str(c.chunk):
            raise _refuse(
                f,
                f"chunk {c.file} holds chunk {header['chunk']} of {header['table']}, not chunk {c.chunk} of {c.table}",
            )
        size = p.stat().st_size
        if size != c.bytes:
            what = "truncated" if size < c.bytes else "longer than exported"
            raise _refuse(f, f"chunk {c.file} is {what} ({size} bytes, the manifest says {c.bytes})")
        if file_sha256(p) != c.sha256:
            raise _refuse(f, f"chunk {c.file} is damaged (its SHA-256 differs from the manifest's)")
    return manifest
