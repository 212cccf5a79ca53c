"""Registered readers (targets) and retention: the log removes only what every registered reader has applied.

``<root>/readers/<name>.json`` holds a reader's applied position (atomic write). Retention deletes whole segments
whose last position is at or below the minimum applied position over all registered readers, after recording in
``retained.json`` where the log now starts. With no reader registered nothing is deleted, unless told to keep nothing.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirrorline.errors import LogError
from mirrorline.log.interchange import address_at
from mirrorline.log.layout import read_json, write_json_atomic
from mirrorline.log.reader import ChangeLog, read_retained
from mirrorline.log.segments import remove_segment
from mirrorline.position import Position

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
log_ = logging.getLogger("mirrorline.log")


@dataclass(frozen=True)
class ReaderState:
    name: str
    applied: Position | None  # None: registered, nothing applied yet (keeps the whole log)
    updated: float  # seconds since the epoch


def _file(name: str) -> str:
    if not _NAME_RE.match(name):
        raise LogError(f"invalid reader name {name!r}", hint="use letters, digits, _ and -", reader=name)
    return f"{name}.json"


def set_applied(log: ChangeLog, name: str, applied: Position | None) -> None:
    """Register reader ``name`` (or update it) with the position it has applied."""
    layout = log.layout
    layout.readers.mkdir(parents=True, exist_ok=True)
    rec = {
        "name": name,
        "updated": time.time(),
        "applied": str(applied) if applied is not None else None,
        "lsn": applied.lsn if applied is not None else None,
        "seq": applied.seq if applied is not None else None,
    }
    write_json_atomic(layout.readers / _file(name), rec)


def unregister(log: ChangeLog, name: str) -> None:
    (log.layout.readers / _file(name)).unlink(missing_ok=True)


EXPORT_PREFIX = "export-"  # the reader a ``snapshot export`` folder registers until it is loaded


def unconfigured(log: ChangeLog, targets: Iterable[str]) -> dict[str, ReaderState]:
    """Registered readers that are neither a configured target nor an export folder: targets removed from the
    configuration, still holding the log at their position until dropped (``mirrorline target drop``)."""
    known = set(targets)
    return {n: r for n, r in readers(log).items() if n not in known and not n.startswith(EXPORT_PREFIX)}


def exports(log: ChangeLog) -> dict[str, ReaderState]:
    """The readers of ``snapshot export`` folders not loaded yet."""
    return {n: r for n, r in readers(log).items() if n.startswith(EXPORT_PREFIX)}


def expire_exports(log: ChangeLog, expiry: float, now: float | None = None) -> list[str]:
    """Unregister the export folders registered more than ``expiry`` seconds ago (0: never): they stop holding the
    log (loading one later is refused if the log no longer has what it needs). Returns their names."""
    if expiry <= 0:
        return []
    now = time.time() if now is None else now
    gone = [n for n, r in exports(log).items() if now - r.updated > expiry]
    for n in gone:
        unregister(log, n)
        log_.warning("%s was not loaded within the log's export_expiry: it no longer holds the log", n)
    return gone


def readers(log: ChangeLog) -> dict[str, ReaderState]:
    out: dict[str, ReaderState] = {}
    folder = log.layout.readers
    if not folder.is_dir():
        return out
    for p in sorted(folder.glob("*.json")):
        if p.name.startswith("."):
            continue
        d = read_json(p)
        lsn, seq = d.get("lsn"), d.get("seq")
        applied = Position(int(lsn), int(seq or 0)) if lsn is not None else None
        out[d.get("name", p.stem)] = ReaderState(d.get("name", p.stem), applied, float(d.get("updated", 0)))
    return out


def _reload_path(log: ChangeLog, name: str) -> Path:
    return log.layout.root / "reload" / _file(name)


def needs_reload(log: ChangeLog) -> dict[str, dict[str, Any]]:
    """The targets the log's cap left behind (``[log] max_age`` / ``max_size``): the log no longer holds the changes
    they need; ``snapshot --target NAME`` loads them again."""
    folder = log.layout.root / "reload"
    if not folder.is_dir():
        return {}
    out = {}
    for p in sorted(folder.glob("*.json")):
        d = read_json(p)
        out[str(d.get("name", p.stem))] = d
    return out


def mark_reload(log: ChangeLog, name: str, reason: str, **facts: Any) -> None:
    """``name`` needs a reload (``reason``: why the log cannot bring it up to date), and is unregistered."""
    _reload_path(log, name).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_reload_path(log, name), {"name": name, "reason": reason, **facts, "at": time.time()})
    unregister(log, name)


def reload_reason(record: dict[str, Any]) -> str:
    """Why a target needs a reload, from its record (:func:`needs_reload`)."""
    if record.get("reason"):
        return str(record["reason"])
    return (
        f"the log's cap (max_age / max_size) removed changes it had not applied (it had applied up to "
        f"{record.get('applied')}, the log starts after {record.get('log_starts_after')})"
    )


def clear_reload(log: ChangeLog, name: str) -> None:
    _reload_path(log, name).unlink(missing_ok=True)


def _capped(segs: list[Any], max_age: float, max_size: int, now: float) -> int:
    """How many of the oldest segments the cap removes: those older than ``max_age`` (their newest change), then
    more until the rest fits in ``max_size`` bytes (0: no cap)."""
    n = 0
    if max_age > 0:
        while n < len(segs) and segs[n].max_ts / 1e6 < now - max_age:
            n += 1
    if max_size > 0:
        sizes = [tree_size(s.path) for s in segs]
        total = sum(sizes[n:])
        while n < len(segs) and total > max_size:
            total -= sizes[n]
            n += 1
    return n


def tree_size(p: Path) -> int:
    """Bytes of a segment: a file, or a folder of parts."""
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def retain(
    log: ChangeLog, keep_nothing: bool = False, max_age: float = 0.0, max_size: int = 0, now: float | None = None
) -> list[str]:
    """Delete whole segments every registered reader has applied, and (the log's cap) those older than
    ``max_age`` seconds or beyond ``max_size`` bytes: a reader that has not applied what the cap removes is marked
    *needs reload* (:func:`needs_reload`) and unregistered. Returns the removed segments' names (oldest first)."""
    old = read_retained(log.layout)
    if old is not None:  # a retention run that stopped half-way: finish it
        for s in log.segment_files():
            if s.last <= old.after:
                remove_segment(s.path)
    states = readers(log)
    segs = log.segments()
    cap = _capped(segs, max_age, max_size, time.time() if now is None else now) if segs else 0
    if cap:
        cut = segs[cap - 1].last
        for name, r in states.items():
            if r.applied is None or r.applied < cut:
                if not name.startswith(EXPORT_PREFIX):
                    facts = {"applied": str(r.applied), "log_starts_after": str(cut)}
                    mark_reload(log, name, "", **facts)
                unregister(log, name)
                log_.warning(
                    "%s fell behind the log's cap (it applied up to %s, the log now starts after %s): it needs a "
                    "reload (mirrorline snapshot --target %s)",
                    name,
                    r.applied,
                    cut,
                    name,
                )
        states = readers(log)
    if not states and not keep_nothing and not cap:
        return []
    applied = [s.applied for s in states.values()]
    if any(a is None for a in applied) and not cap:
        return []
    known = [a for a in applied if a is not None]
    bound = min(known) if known and not any(a is None for a in applied) else None
    if bound is not None:
        by_readers = [s for s in segs if s.last <= bound]
    else:  # no reader: nothing (unless told to keep nothing); a reader with nothing applied keeps everything
        by_readers = segs if keep_nothing and not states else []
    doomed = segs[: max(cap, len(by_readers))]
    if not doomed:
        return []

    max_ts = max([s.max_ts for s in doomed] + ([old.max_ts] if old else []))
    last = doomed[-1].last
    addr = address_at(log, last)  # so that the lines after keep their daystream addresses
    marks = [s.imported for s in doomed if s.imported] + ([old.imported] if old and old.imported else [])
    record = {"lsn": last.lsn, "seq": last.seq, "position": str(last), "max_ts": max_ts}
    record.update({"c": addr.c, "c_lines": addr.lines, "imported": list(max(marks)) if marks else None})
    # record where the log now starts before anything goes, so a crash mid-way leaves a consistent log
    write_json_atomic(log.layout.retained, record)
    for s in doomed:
        remove_segment(s.path)
    return [s.name for s in doomed]


def check_reader(log: ChangeLog, name: str) -> Position | None:
    """A registered reader's applied position, checked to be still retained (LogError otherwise)."""
    state = readers(log).get(name)
    if state is None:
        raise LogError(f"no reader named {name!r} is registered with the log", reader=name)
    log.select(state.applied)
    return state.applied
