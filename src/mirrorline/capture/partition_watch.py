"""The watch on configured partitioned tables while capture streams: every few seconds a look at their leaves,
compared with the last one (:mod:`mirrorline.capture.partitions` decides what a change means), and what the looks
found until it is settled: tables whose rows at the targets are no longer the source's, to be marked between two
transactions, and suspected truncations waiting for the log to pass them.

The reads at the source are :class:`~mirrorline.capture.source.TypeNames`'; the last look is kept in the log
(``partitions.json``), so that what happened while capture was stopped is found at the next start. Marking a table
(a schema version with ``resync``) is the session's (:mod:`mirrorline.capture.session`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from mirrorline.capture import partitions
from mirrorline.capture.source import TypeNames
from mirrorline.config import Config
from mirrorline.errors import LogError
from mirrorline.log.layout import read_json, write_json_atomic
from mirrorline.log.reader import ChangeLog
from mirrorline.position import Position, format_lsn

log = logging.getLogger("mirrorline.capture")

PARTITIONS_FILE = "partitions.json"  # the last look at the configured partitioned tables' leaves


class PartitionWatch:
    """The looks at the configured partitioned tables' leaves (``oids``: the configured tables' relids, as the
    session holds them now), and what they found that is not settled yet."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.look: partitions.Look | None = None  # the last look at configured partitioned tables' leaves
        self.resyncs: dict[int, str] = {}  # relid -> what happened, until the next transaction boundary

    @property
    def waiting(self) -> bool:
        """Something found is not settled yet: a suspect the log has not passed, or a table not marked yet."""
        return self.look is not None and bool(self.look.suspects or self.resyncs)

    def check(self, types: TypeNames, oids: Mapping[int, str]) -> None:
        """The look at configured partitioned tables' leaves (capture/partitions.py): a partition attached with
        rows, detached or dropped with rows, or truncated alone marks its table (a schema version with ``resync``),
        and every target stops that table until it is loaded again."""
        found = types.leaves(oids)
        if found is None:
            return
        since, lsn, now = found
        last = self.look if self.look is not None else self._kept_look()
        keep = {root: dict(leaves) for root, leaves in now.items()}
        suspects = list(last.suspects) if self.look is None else list(self.look.suspects)
        for ch in partitions.changes(last.tree, now):
            verdict = self._verdict(types, oids, ch)
            if verdict is None:  # could not tell yet: looked at again next time
                keep[ch.root] = dict(last.tree[ch.root])
            elif verdict == "suspect":
                suspects.append(partitions.Suspect(ch.root, ch.leaf, last.since, lsn))
            elif verdict:
                self.resyncs.setdefault(ch.root, verdict)
        self.look = partitions.Look(since, lsn, keep, tuple(suspects))
        if keep or suspects or last.tree:
            write_json_atomic(self.config.log.path / PARTITIONS_FILE, partitions.to_json(self.look))

    def due(self, oids: Mapping[int, str], durable_lsn: int, in_transaction: bool) -> list[tuple[int, str]]:
        """Suspects the log (durable through ``durable_lsn``) now explains or not; then, between transactions (a
        transaction's changes of a table carry one version), the tables to mark now: (relid, what happened)."""
        look = self.look
        if look is not None and look.suspects:
            settled = [x for x in look.suspects if x.lsn <= durable_lsn]
            for sus in settled:
                table = oids.get(sus.root)
                if table is not None and table not in self._logged_truncates(sus.since, sus.lsn):
                    self.resyncs.setdefault(sus.root, partitions.Change("refilled", sus.root, sus.leaf).describe())
            if settled:
                self.look = replace(look, suspects=tuple(x for x in look.suspects if x not in settled))
                write_json_atomic(self.config.log.path / PARTITIONS_FILE, partitions.to_json(self.look))
        if not self.resyncs or in_transaction:
            return []
        out = sorted(self.resyncs.items())
        self.resyncs.clear()
        return out

    def _kept_look(self) -> partitions.Look:
        """The last look of an earlier run (what happened while capture was stopped is found against it)."""
        path = self.config.log.path / PARTITIONS_FILE
        empty = partitions.Look(0, 0, {})
        if not path.exists():
            return empty
        try:
            return partitions.from_json(read_json(path))
        except (OSError, ValueError) as e:
            log.warning("cannot read %s (%s): partitions are compared from now on", path, e)
            return empty

    def _logged_truncates(self, after: int, upto: int) -> set[str]:
        """The tables the log holds a TRUNCATE of, committed in ``(after, upto]`` (source positions)."""
        import pyarrow.compute as pc

        out: set[str] = set()
        try:
            for b in ChangeLog(self.config.log.path).read_arrow(Position(after), Position(upto, 1 << 62)):
                t = b.filter(pc.equal(b.column("op"), "T"))
                out.update(t.column("table").to_pylist())
        except LogError as e:  # (no longer retained: nothing explains a replaced partition)
            log.debug("truncates after %s not read: %s", format_lsn(after), e)
        return out

    def _verdict(self, types: TypeNames, oids: Mapping[int, str], ch: partitions.Change) -> str | None:
        """What ``ch`` did to its table's rows: a description when the targets' rows are no longer the source's,
        "" when nothing, "suspect" when a TRUNCATE of the root may explain it, None when it cannot be told yet."""
        if ch.kind == "added":
            older = types.rows_before(ch.leaf)
            return None if older is None else ch.describe() if older else ""
        if ch.kind == "removed":
            table = oids.get(ch.root)
            if table is not None and self.config.table(table).detached_partitions == "keep":
                log.info("table %s: %s at the source: its rows stay at the targets", table, ch.describe())
                return ""
            held = types.holds_rows(ch.leaf.relid)
            if held is None:  # dropped (or unreadable): what it held at the last look decides
                return ch.describe("dropped (or detached) with its rows") if ch.leaf.size > 0 else ""
            return ch.describe("detached with its rows") if held else ""
        older = types.rows_before(ch.leaf)
        return None if older is None else "" if older else "suspect"
