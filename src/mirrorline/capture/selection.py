"""Part of a table (DESIGN §3, per table ``columns`` / ``exclude`` / ``where``): which columns and rows of a configured
table are replicated, checked against the table as the source has it, and how the publication says so (PostgreSQL 15's
column lists and row filters, so that the source itself sends only those).

PostgreSQL's rules, which this module checks before the publication is touched: a publication that publishes updates
and deletes must list every column of the table's replica identity (else the source refuses the table's UPDATE and
DELETE statements), and its row filter may use only those columns (same). A row that an update moves out of the filter
is sent as a delete, one that it moves in as an insert, so a target holds exactly the rows that pass the filter now.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mirrorline.config import Config, TableConfig
from mirrorline.errors import ConfigError
from mirrorline.model import Column, quote_ident, quote_table

_LITERAL = re.compile(r"'(?:[^']|'')*'")
_QUOTED = re.compile(r'"((?:[^"]|"")+)"')
_BARE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_$]*)\b")


def filter_columns(where: str, names: Sequence[str]) -> list[str]:
    """The columns of ``names`` that the row filter ``where`` names (string literals left out; a bare word is
    folded to lower case as PostgreSQL does)."""
    text = _LITERAL.sub("''", where)
    used = {m.group(1).replace('""', '"') for m in _QUOTED.finditer(text)}
    used |= {m.group(1).lower() for m in _BARE.finditer(_QUOTED.sub(" ", text))}
    return [n for n in names if n in used]


def selected(
    file: str, table: str, tcfg: TableConfig, columns: Sequence[Column], identity: Sequence[str]
) -> tuple[Column, ...]:
    """The table's columns to replicate (in the table's order), checked: every configured name exists, and the
    replica identity and the row filter's columns are among them (the filter's also in the identity)."""
    where_key = f'tables."{table}"'
    names = [c.name for c in columns]
    asked = tcfg.select or tcfg.exclude
    unknown = [c for c in asked if c not in names]
    if unknown:
        field = "columns" if tcfg.select else "exclude"
        raise ConfigError(file, f"{where_key}.{field}", f"{table} has no column(s) {', '.join(unknown)}")
    keep = [c for c in columns if (c.name in tcfg.select if tcfg.select else c.name not in tcfg.exclude)]
    kept = {c.name for c in keep}
    if not keep:
        raise ConfigError(file, f"{where_key}.exclude", f"leaves no column of {table} to replicate")
    left_out = [k for k in identity if k not in kept]
    if left_out:
        full = set(identity) == set(names)
        raise ConfigError(
            file,
            f"{where_key}.{'columns' if tcfg.select else 'exclude'}",
            f"leaves out {', '.join(left_out)}, of {table}'s replica identity "
            f"({'REPLICA IDENTITY FULL: every column' if full else ', '.join(identity)}): PostgreSQL would refuse the "
            "table's updates and deletes at the source",
            hint="replicate the identity's columns"
            + ("; or give the table a primary key (or REPLICA IDENTITY USING INDEX)" if full else ""),
        )
    if tcfg.where is not None:
        outside = [c for c in filter_columns(tcfg.where, names) if c not in identity]
        if outside:
            raise ConfigError(
                file,
                f"{where_key}.where",
                f"uses {', '.join(outside)}, not in {table}'s replica identity ({', '.join(identity)}): PostgreSQL "
                "would refuse the table's updates and deletes at the source",
                hint=f"filter on the identity's columns, or ALTER TABLE {quote_table(table)} REPLICA IDENTITY FULL",
            )
    return tuple(keep)


def check_filter(conn: Any, file: str, table: str, where: str) -> None:
    """The row filter is a valid boolean expression on the table (asked of the source, reading nothing); a
    :class:`ConfigError` naming the table and PostgreSQL's own words otherwise. A role that may not read the table
    passes here: :mod:`~mirrorline.capture.prerequisites` names the grant it needs."""
    import psycopg2

    own = not conn.autocommit
    with conn.cursor() as cur:
        if own:
            cur.execute("SAVEPOINT mirrorline_where")
        try:
            cur.execute(f"SELECT 1 FROM {quote_table(table)} WHERE ({where}) LIMIT 0")
        except psycopg2.Error as e:
            if own:
                cur.execute("ROLLBACK TO SAVEPOINT mirrorline_where")
            if e.pgcode == "42501":  # the role may not read the table: the start's checks name the grant
                return
            text = (e.pgerror or str(e)).strip().splitlines()[0].removeprefix("ERROR:").strip()
            raise ConfigError(
                file,
                f'tables."{table}".where',
                f"{where!r} is not a row filter of {table}: {text}",
                hint='a PostgreSQL boolean expression on the table\'s columns, such as "amount > 0"',
            ) from None
        if own:
            cur.execute("RELEASE SAVEPOINT mirrorline_where")


def publication_spec(table: str, tcfg: TableConfig | None, columns: Sequence[str] | None) -> str:
    """The table as ``CREATE/ALTER PUBLICATION ... TABLE`` names it: with its column list (``columns``: None for
    every column) and row filter."""
    out = quote_table(table)
    if columns is not None:
        out += " (" + ", ".join(quote_ident(c) for c in columns) + ")"
    if tcfg is not None and tcfg.where is not None:
        out += f" WHERE ({tcfg.where})"
    return out


def publication_specs(config: Config, tables: Mapping[str, Any]) -> dict[str, str]:
    """Each described table (``tables``: name -> its description, with ``columns`` and the ``left_out`` ones) as the
    publication names it: a column list only when some column is left out (PostgreSQL 15 refuses any column list on
    a table whose replica identity is FULL, even one naming every column)."""
    out = {}
    for name, st in tables.items():
        out[name] = publication_spec(name, config.table(name), [c.name for c in st.columns] if st.left_out else None)
    return out


Part = tuple[list[str] | None, str | None]  # the columns replicated (None: every one), the row filter (None: none)
PARTS_FILE = "parts.json"


def read_parts(log_root: Path) -> dict[str, Part]:
    """The part of each table the log's changes were captured with, as the last capture recorded it."""
    try:
        data = json.loads((log_root / PARTS_FILE).read_text())
    except FileNotFoundError:
        return {}
    return {t: (v[0], v[1]) for t, v in data.items()}


def write_parts(log_root: Path, parts: Mapping[str, Part]) -> None:
    tmp = log_root / f".{PARTS_FILE}.tmp"
    tmp.write_text(json.dumps({t: list(v) for t, v in sorted(parts.items())}))
    tmp.replace(log_root / PARTS_FILE)


def changed_parts(before: Mapping[str, Part], now: Mapping[str, Part], logged: set[str]) -> dict[str, str]:
    """The tables the log holds changes of (``logged``) whose part is not the one they were captured with (a table
    not recorded before was captured whole), with what changed."""
    out = {}
    for table, (cols, where) in now.items():
        if table not in logged:
            continue
        was_cols, was_where = before.get(table, (None, None))
        what = []
        if was_cols != cols:
            what.append("its replicated columns changed")
        if was_where != where:
            what.append("its row filter changed")
        if what:
            out[table] = " and ".join(what) + " in the configuration"
    return out
