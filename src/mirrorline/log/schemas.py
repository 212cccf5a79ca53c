"""Every version of every table's schema, kept durably under ``<root>/schemas/`` so any later reader can decode a
change by ``(table, schema_version)``.

One immutable JSON file per version (``<table>@<version>.json``, the table name percent-encoded), written atomically.
The same columns and key as an existing version reuse that version.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mirrorline.errors import LogError
from mirrorline.log.layout import read_json, write_json_atomic
from mirrorline.model import Column, TableSchema
from mirrorline.position import Position


def schema_to_json(s: TableSchema) -> dict[str, Any]:
    return {
        "table": s.table,
        "version": s.version,
        "since": [s.since.lsn, s.since.seq],
        "key": list(s.key),
        **({"bag": True} if s.bag else {}),
        **({"relid": s.relid} if s.relid else {}),
        **({"resync": s.resync} if s.resync else {}),
        "columns": [
            {
                "name": c.name,
                "type": c.type_name,
                "oid": c.type_oid,
                "typmod": c.typmod,
                "nullable": c.nullable,
                **({"attnum": c.attnum} if c.attnum else {}),
                **({"missing": c.missing_value} if c.missing_value is not None else {}),
                **({"default_unlogged": True} if c.default_unlogged else {}),
            }
            for c in s.columns
        ],
    }


def schema_from_json(d: dict[str, Any]) -> TableSchema:
    """Tolerates keys older versions did not write."""
    since = d.get("since") or [0, 0]
    return TableSchema(
        table=d["table"],
        columns=tuple(
            Column(
                name=c["name"],
                type_name=c.get("type", "text"),
                type_oid=int(c.get("oid", 0)),
                typmod=int(c.get("typmod", -1)),
                nullable=bool(c.get("nullable", True)),
                attnum=int(c.get("attnum", 0)),
                missing_value=c.get("missing"),
                default_unlogged=bool(c.get("default_unlogged", False)),
            )
            for c in d["columns"]
        ),
        key=tuple(d.get("key") or ()),
        version=int(d["version"]),
        since=Position(int(since[0]), int(since[1])),
        bag=bool(d.get("bag", False)),
        relid=int(d.get("relid", 0)),
        resync=str(d.get("resync", "")),
    )


def _file_name(table: str, version: int) -> str:
    return f"{quote(table, safe='')}@{version}.json"


class SchemaStore:
    """The schemas of one log. Reads are cached; only the writer (under its lock) records new versions."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._by_table: dict[str, dict[int, TableSchema]] = {}
        self._loaded: set[str] = set()

    def refresh(self) -> None:
        if not self.folder.is_dir():
            return
        for p in self.folder.iterdir():
            if p.name.startswith(".") or p.suffix != ".json" or p.name in self._loaded:
                continue
            try:
                s = schema_from_json(read_json(p))
            except (KeyError, TypeError, ValueError) as e:
                raise LogError(
                    f"schema file {p} is damaged: {e}", hint="restore the log's schemas folder", path=str(p)
                ) from None
            self._by_table.setdefault(s.table, {})[s.version] = s
            self._loaded.add(p.name)

    def versions(self, table: str) -> dict[int, TableSchema]:
        return dict(self._by_table.get(table, {}))

    def tables(self) -> list[str]:
        return sorted(self._by_table)

    def get(self, table: str, version: int) -> TableSchema:
        s = self._by_table.get(table, {}).get(version)
        if s is None:
            self.refresh()
            s = self._by_table.get(table, {}).get(version)
        if s is None:
            raise LogError(
                f"the log has no schema version {version} of {table}",
                hint="the log's schemas folder is incomplete",
                table=table,
                version=version,
            )
        return s

    def latest(self, table: str) -> TableSchema | None:
        versions = self._by_table.get(table)
        return versions[max(versions)] if versions else None

    def plan(self, schema: TableSchema) -> TableSchema:
        """The version ``schema`` gets: an existing one with the same columns, key and bagness of the same relation
        (a table dropped and created again, or another renamed to its name, is a new version), else the next
        number."""
        versions = self._by_table.get(schema.table, {})
        latest = versions[max(versions)] if versions else None
        if latest is not None and latest.resync and not schema.resync and latest.relid == schema.relid:
            schema = replace(schema, resync=latest.resync)  # a Relation message knows nothing of it
        # a column the catalog no longer names as it was (capture looked it up after a later rename or drop) keeps
        # the facts its logged versions recorded for it
        known = {(c.name, c.type_name): c for v in sorted(versions) for c in versions[v].columns if c.attnum}
        if any(not c.attnum and (c.name, c.type_name) in known for c in schema.columns):
            schema = replace(
                schema,
                columns=tuple(
                    replace(
                        c,
                        attnum=k.attnum,
                        missing_value=k.missing_value,
                        default_unlogged=k.default_unlogged,
                    )
                    if not c.attnum and (k := known.get((c.name, c.type_name))) is not None
                    else c
                    for c in schema.columns
                ),
            )
        for v in sorted(versions):
            s = versions[v]
            same_relation = not s.relid or not schema.relid or s.relid == schema.relid
            same = s.columns == schema.columns and s.key == schema.key and s.bag == schema.bag
            if same and same_relation and s.resync == schema.resync:
                return s
        return replace(schema, version=max(versions, default=0) + 1)

    def record(self, schema: TableSchema) -> TableSchema:
        """Assign (or reuse) a version and make it durable before returning it."""
        s = self.plan(schema)
        if s.version not in self._by_table.get(s.table, {}):
            name = _file_name(s.table, s.version)
            write_json_atomic(self.folder / name, schema_to_json(s))
            self._by_table.setdefault(s.table, {})[s.version] = s
            self._loaded.add(name)
        return s
