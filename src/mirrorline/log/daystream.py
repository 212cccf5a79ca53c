"""The deltaflood/daystream line format (seed 002), pure: lines <-> changes, no I/O.

A line is tab-separated name/value pairs: the daystream tags ``_c`` (commit time, whole seconds since the epoch)
and ``_s`` (sequence of the line among the lines of the same ``_c``), then deltaflood's ``_table``, ``_xid`` and
``_action``, then the row's columns.

``(_c, _s)`` is a line's stable address (:class:`Address`), as seed 002's hosts use it to restart where they left
off: ``_c`` is the change's commit second, but never less than the ``_c`` of the line before it (commit timestamps
of concurrent transactions may go back a little in commit order), and ``_s`` counts the lines of that ``_c`` from
the first in the whole log. Addresses increase line by line, and the same change gets the same address in every
export, wherever the export starts. Escaping is deltaflood's: ``\\t``, ``\\n``, ``\\\\`` and ``\\NNN`` (octal) for
other control characters (octal escapes of UTF-8 bytes are accepted too).

Mapping to log changes (the seed's ``_action`` values, as the deltaflood plugin emits them):

- ``insert``: an insert; ``update``: an update with the new row (deltaflood sends whole rows);
- ``delete``: a delete, with the key columns;
- ``replace``: the old key of the update on the next line (an update that changed the key); the pair becomes one
  update with ``old_key`` set;
- ``truncate`` (not in deltaflood, mirrorline's addition): a TRUNCATE of ``_table``, no columns.

NULL values are left out of a line (deltaflood's default ``skip-nulls``): a column of the table's schema missing
from a line is NULL (a NOT NULL key column missing is an error). A ``replace`` line and its ``update`` are read as
one change even when they lie in two files of one import, or the lines carry no ``_xid``. Columns whose unchanged
TOAST value was not sent are named in the pseudo-column ``_unchanged`` (a JSON list, mirrorline's addition). As in
the seed, key-only lines (``delete``, ``replace``) end with an empty pair; empty pairs are ignored when reading.
``_table`` is ``name`` for tables in schema ``public`` (as deltaflood prints them), else ``schema.name``. Other
pseudo-columns of deltaflood (``_oid``, ``_lsn``, ``_qualified_table``) are accepted; ``_qualified_table`` (e.g.
``"s"."t"``) names the table when present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from mirrorline.model import Change, Op, TableSchema, Value
from mirrorline.position import ZERO

ACTIONS = ("insert", "update", "delete", "replace", "truncate")
PSEUDO = frozenset({"_c", "_s", "_table", "_xid", "_action", "_oid", "_lsn", "_qualified_table", "_unchanged"})
_OCTAL = re.compile(r"[0-7]{3}")
_C_RE = re.compile(r"^(\d{1,12})(?:\.(\d{1,6}))?$")
_ESCAPES = {"t": b"\t", "n": b"\n", "\\": b"\\"}


class LineError(ValueError):
    """A line that does not parse; the caller adds file and line number."""


def escape(text: str) -> str:
    if not any(ch < " " or ch == "\\" for ch in text):
        return text
    out = []
    for ch in text:
        if ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\\":
            out.append("\\\\")
        elif ch < " ":
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    return "".join(out)


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        j = text.find("\\", i)
        if j < 0:
            out += text[i:].encode()
            break
        out += text[i:j].encode()
        nxt = text[j + 1 : j + 2]
        if nxt in _ESCAPES:
            out += _ESCAPES[nxt]
            i = j + 2
        elif _OCTAL.fullmatch(text[j + 1 : j + 4]):
            out.append(int(text[j + 1 : j + 4], 8) & 0xFF)
            i = j + 4
        else:
            raise LineError(f"bad escape {text[j : j + 4]!r} (expected \\t, \\n, \\\\ or \\NNN octal)")
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise LineError("escaped bytes are not UTF-8") from None


@dataclass
class Line:
    """One parsed line."""

    table: str
    action: str
    columns: dict[str, str]  # in line order
    c: int | None = None  # _c as microseconds since the epoch
    s: int | None = None
    xid: int | None = None
    unchanged: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)


def _table_name(name: str) -> str:
    return name if "." in name else f"public.{name}"


def _qualified(text: str) -> str:
    m = re.fullmatch(r'("(?:[^"]|"")+"|[^."]+)\.("(?:[^"]|"")+"|[^."]+)', text)
    if not m:
        raise LineError(f"bad _qualified_table {text!r}")
    parts = [p[1:-1].replace('""', '"') if p.startswith('"') else p for p in m.groups()]
    return f"{parts[0]}.{parts[1]}"


def parse_line(text: str) -> Line | None:
    """Parse one line (without or with its line end). ``None`` for a blank line; LineError when it does not parse."""
    text = text.rstrip("\r\n")
    if not text.strip():
        return None
    fields = text.split("\t")
    if len(fields) % 2:
        raise LineError(f"{len(fields)} tab-separated fields: names and values must pair up")
    pseudo: dict[str, str] = {}
    columns: dict[str, str] = {}
    for k in range(0, len(fields), 2):
        name, value = fields[k], fields[k + 1]
        if not name:
            if value:
                raise LineError(f"value {value!r} without a name")
            continue
        name = unescape(name)
        target = pseudo if name in PSEUDO else columns
        if name in target:
            raise LineError(f"{name} appears twice")
        target[name] = unescape(value)
    for required in ("_table", "_action"):
        if required not in pseudo:
            raise LineError(f"no {required}")
    action = pseudo["_action"]
    if action not in ACTIONS:
        raise LineError(f"unknown _action {action!r} (expected one of {', '.join(ACTIONS)})")
    line = Line(table=_table_name(pseudo["_table"]), action=action, columns=columns)
    if "_qualified_table" in pseudo:
        line.table = _qualified(pseudo["_qualified_table"])
    if "_c" in pseudo:
        m = _C_RE.match(pseudo["_c"])
        if not m:
            raise LineError(f"_c {pseudo['_c']!r} is not seconds since the epoch")
        line.c = int(m.group(1)) * 1_000_000 + int((m.group(2) or "0").ljust(6, "0"))
    for name, attr in (("_s", "s"), ("_xid", "xid")):
        if name in pseudo:
            if not (pseudo[name].isascii() and pseudo[name].isdigit()):  # ('²' is a digit to isdigit())
                raise LineError(f"{name} {pseudo[name]!r} is not a non-negative integer")
            setattr(line, attr, int(pseudo[name]))
    if "_unchanged" in pseudo:
        try:
            names = json.loads(pseudo["_unchanged"])
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            raise LineError("_unchanged is not a JSON list of column names")
        line.unchanged = tuple(names)
    line.extra = {k: v for k, v in pseudo.items() if k in ("_oid", "_lsn")}
    return line


def format_line(
    c: int,
    s: int,
    table: str,
    xid: int,
    action: str,
    columns: Iterable[tuple[str, str]],
    unchanged: Iterable[str] = (),
    pad: bool = False,
) -> str:
    """One daystream line (no line end). ``c`` in whole seconds."""
    name = table[len("public.") :] if table.startswith("public.") else table
    parts = ["_c", str(c), "_s", str(s), "_table", escape(name), "_xid", str(xid), "_action", action]
    names = sorted(unchanged)
    if names:
        parts += ["_unchanged", escape(json.dumps(names))]
    for k, v in columns:
        parts += [escape(k), escape(v)]
    if pad:
        parts += ["", ""]
    return "\t".join(parts)


# -- lines -> changes ------------------------------------------------------------------------------------------


@dataclass
class Transaction:
    """Changes of one imported transaction (positions not assigned yet: ``pos`` is ZERO)."""

    xid: int
    ts: int  # commit time, microseconds
    changes: list[Change]


class Decoder:
    """Turns parsed lines into transactions: consecutive lines with the same ``_xid`` are one transaction (a line
    without ``_xid`` is a transaction of its own). ``schema_of(table)`` gives the table's schema (key, columns)."""

    def __init__(self, schema_of: Callable[[str], TableSchema], default_ts: int) -> None:
        self.schema_of = schema_of
        self.default_ts = default_ts
        self._txn: Transaction | None = None
        self._replace: tuple[str, tuple[Value, ...]] | None = None

    def feed(self, line: Line) -> Transaction | None:
        """Take one line; returns the previous transaction when this line starts a new one."""
        done = None
        pending = self._replace is not None and (line.xid is None or line.xid == self._txn_xid())
        if self._txn is not None and not pending and (line.xid is None or line.xid != self._txn.xid):
            done = self.finish()  # (a replace line is one change with the update after it, wherever that is)
        if self._txn is None:
            self._txn = Transaction(line.xid or 0, line.c if line.c is not None else self.default_ts, [])
        elif line.c is not None:
            self._txn.ts = max(self._txn.ts, line.c)
        change = self._change(line)
        if change is not None:
            self._txn.changes.append(change)
        return done

    def _txn_xid(self) -> int | None:
        return self._txn.xid if self._txn is not None else None

    def finish(self) -> Transaction | None:
        """The transaction in progress, if any (at the end of the input)."""
        if self._replace is not None:
            raise LineError("a replace line must be followed by the update of the same table")
        txn, self._txn = self._txn, None
        return txn

    def _key(self, line: Line, schema: TableSchema) -> tuple[Value, ...]:
        """The line's key. A nullable key column (a table keyed on its columns, REPLICA IDENTITY FULL) left out is
        NULL, as every column left out is (skip-nulls); a NOT NULL one left out is an error."""
        missing = [k for k in schema.key if k not in line.columns and not schema.column(k).nullable]
        if missing:
            raise LineError(f"{line.action} on {line.table} lacks key column(s) {', '.join(missing)}")
        return tuple(line.columns.get(k) for k in schema.key)

    def _change(self, line: Line) -> Change | None:
        txn = self._txn
        assert txn is not None
        schema = self.schema_of(line.table)
        unknown = [c for c in list(line.columns) + list(line.unchanged) if c not in schema.column_names]
        if unknown:
            raise LineError(
                f"{line.table} has no column(s) {', '.join(unknown)} (its columns: {', '.join(schema.column_names)})"
            )
        old_key = None
        if self._replace is not None:
            table, old_key = self._replace
            self._replace = None
            if line.action != "update" or line.table != table:
                raise LineError(
                    f"a replace line must be followed by the update of {table}, got {line.action} of {line.table}"
                )
        if line.action == "replace":
            self._replace = (line.table, self._key(line, schema))
            return None
        if line.action == "truncate":
            if line.columns:
                raise LineError("a truncate line has no columns")
            return Change(ZERO, 0, txn.xid, line.table, Op.TRUNCATE, schema_version=schema.version)
        key = self._key(line, schema)
        if line.action == "delete":
            return Change(ZERO, 0, txn.xid, line.table, Op.DELETE, key, schema_version=schema.version)
        unchanged = frozenset(line.unchanged)
        if line.action == "insert" and unchanged:
            raise LineError("an insert cannot have _unchanged columns")
        new = {c: line.columns.get(c) for c in schema.column_names if c not in unchanged}
        op = Op.INSERT if line.action == "insert" else Op.UPDATE
        return Change(
            ZERO,
            0,
            txn.xid,
            line.table,
            op,
            key,
            new,
            unchanged,
            old_key if old_key is not None and old_key != key else None,
            schema.version,
        )


# -- changes -> lines ------------------------------------------------------------------------------------------


@dataclass
class Address:
    """The addressing state after a line: its ``_c`` and how many lines of that ``_c`` the log holds up to it."""

    c: int = -1
    lines: int = 0

    def tag(self, ts: int) -> tuple[int, int]:
        """The address of the next line, whose change committed at ``ts`` (microseconds)."""
        c = max(self.c, ts // 1_000_000)
        if c != self.c:
            self.c, self.lines = c, 0
        self.lines += 1
        return c, self.lines - 1

    def skip(self, ts: Sequence[int] | np.ndarray, lines: Sequence[int] | np.ndarray) -> None:
        """The state after lines for changes committed at ``ts`` (microseconds), ``lines[i]`` lines for the i-th
        (as :meth:`tag` once per line, vectorized: retention moves it over whole units of changes)."""
        secs = np.asarray(ts, dtype=np.int64) // 1_000_000
        if not len(secs):
            return
        counts = np.asarray(lines, dtype=np.int64)
        top = int(secs.max())
        if top <= self.c:  # no change starts a new second: every line counts on
            self.lines += int(counts.sum())
            return
        # _c is the running maximum, so the lines of the last second are those from its first change on
        first = int(np.argmax(secs == top))
        self.c, self.lines = top, int(counts[first:].sum())


def line_count(op: str, key_changed: bool) -> int:
    """How many lines a change is: an update that changed the key is a replace line and an update line."""
    return 2 if op == "U" and key_changed else 1


class Encoder:
    """Turns log changes into daystream lines with their addresses; ``start``: the state after the line before the
    first change given (see :func:`mirrorline.log.interchange.address_at`)."""

    def __init__(self, schema_of: Callable[[str, int], TableSchema], start: Address | None = None) -> None:
        self.schema_of = schema_of
        self.address = start if start is not None else Address()
        self.last: tuple[int, int] | None = None  # the address of the last line made

    def _tag(self, ts: int) -> tuple[int, int]:
        self.last = self.address.tag(ts)
        return self.last

    def lines(self, change: Change) -> Iterator[str]:
        ch = change
        if ch.op is Op.TRUNCATE:
            yield format_line(*self._tag(ch.commit_ts), ch.table, ch.xid, "truncate", ())
            return
        key_names = self.schema_of(ch.table, ch.schema_version).key
        if ch.op is Op.DELETE:
            cols = [(k, v) for k, v in zip(key_names, ch.key, strict=True) if v is not None]
            yield format_line(*self._tag(ch.commit_ts), ch.table, ch.xid, "delete", cols, pad=True)
            return
        if ch.op is Op.UPDATE and ch.old_key is not None:
            cols = [(k, v) for k, v in zip(key_names, ch.old_key, strict=True) if v is not None]
            yield format_line(*self._tag(ch.commit_ts), ch.table, ch.xid, "replace", cols, pad=True)
        new = ch.new or {}
        cols = [(k, v) for k, v in new.items() if v is not None]
        action = "insert" if ch.op is Op.INSERT else "update"
        yield format_line(*self._tag(ch.commit_ts), ch.table, ch.xid, action, cols, ch.unchanged)
