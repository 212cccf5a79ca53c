"""What the pipeline asks of its targets besides applying units:

- :func:`failing_table`: whether an error stops one table at a target, or the whole target.
- :class:`Upkeep`: each target's storage upkeep every ``compact_every`` (Delta: compaction and cleanup), in a thread
  of its own beside apply.
- :func:`schema_needs`: what a target opened by the pipeline (or ``verify``) is given to follow schema changes.
- :func:`untrusted_tables`: the tables whose rows at a target the source changed with nothing logged (``status``
  shows them stopped, ``verify`` not comparable).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, TypeVar

from mirrorline.apply import Needs
from mirrorline.apply.target import TargetMoved
from mirrorline.compile.reference import actions_of
from mirrorline.errors import MirrorlineError, TransientTargetError
from mirrorline.snapshot import state as snapstate

if TYPE_CHECKING:
    from mirrorline.apply import AppliedState, Needs, Target
    from mirrorline.compile.batch import NetBatch
    from mirrorline.config import Config, TargetConfig
    from mirrorline.log.reader import ChangeLog

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


def schema_needs(config: Config, changelog: ChangeLog, target: str | None = None) -> Needs:
    """What following schema changes needs, for the targets of ``config``: the log's schemas, each table's policy;
    for ``target``, the tables it keeps in versions."""

    def policy(table: str) -> tuple[bool, bool]:
        t = config.table(table)
        return t.dropped_columns == "keep", t.on_schema_change == "follow"

    def keeps_deleted(table: str) -> bool:
        return "D" not in actions_of(config.actions, table)

    def history(table: str) -> tuple[str, str] | None:
        return config.history(target, table) if target is not None else None

    return Needs(changelog.schemas.get, changelog.shape_at, policy, keeps_deleted, history)


def failing_table(target: TargetConfig, error: Exception, batch: NetBatch) -> str | None:
    """The table ``error`` is about, when it stops that table alone at the target (a value, a row or a schema change
    the target refuses for that table); None when the whole target stops (its connection, its lock, an error not
    about one of the unit's tables, or ``all_or_nothing``)."""

    if target.all_or_nothing or not isinstance(error, MirrorlineError):
        return None
    if isinstance(error, TransientTargetError | TargetMoved):
        return None
    table = error.context.get("table")
    return table if table in batch.tables or table in batch.truncated else None


class Upkeep:
    """Each target's storage upkeep, every ``compact_every`` of its configuration (the first one period after the
    start), in a thread of its own: a unit whose commit meets a compaction's is applied again on the new version."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}  # target -> when its last upkeep started (monotonic)
        self._threads: dict[str, threading.Thread] = {}

    def due(self, targets: Mapping[str, Target], config: Config) -> None:
        """Start the upkeep of each of ``targets`` whose period has passed and that is not still running, by
        ``config`` (the configuration in force now: ``run`` reads it again on SIGHUP)."""
        now = time.monotonic()
        for n, target in targets.items():
            every = config.targets[n].compact_every
            if every <= 0:
                continue
            started = self._started.setdefault(n, now)
            running = self._threads.get(n)
            if now - started < every or (running is not None and running.is_alive()):
                continue
            self._started[n] = now
            retention = config.targets[n].retention_hours
            thread = threading.Thread(
                target=_maintain, args=(n, target, retention), name=f"mirrorline-upkeep-{n}", daemon=True
            )
            self._threads[n] = thread
            thread.start()

    def join(self) -> None:
        """Wait for the upkeeps running (a compaction is one commit per table: let the one running finish)."""
        for thread in self._threads.values():
            thread.join()


def _maintain(name: str, target: Target, retention_hours: int) -> None:
    t0 = time.monotonic()
    try:
        done = target.maintain(retention_hours=retention_hours)
    except Exception as e:  # upkeep is retried at the next period; replication goes on
        log.warning("target %s: compaction and cleanup failed (tried again later): %s", name, e)
        return
    log.info("target %s: compaction and cleanup in %.1f s: %s", name, time.monotonic() - t0, done)


def loading(target: Target, table: str) -> bool:
    """Is a snapshot loading ``table`` into ``target`` now (its snapshot state ``loading``)?"""
    s = target.session()
    try:
        r = snapstate.read(s).get(table)
    finally:
        s.close()
    return r is not None and r.state == snapstate.LOADING


def untrusted_tables(cl: ChangeLog | None, state: AppliedState) -> dict[str, str]:
    """The tables not held at the target whose rows the log marks as changed at the source with nothing logged
    after the target took its shape (``TableSchema.resync``: capture/partitions.py), each with the mark: the target
    stops each at its next change; ``status`` and ``verify`` say so now."""
    if cl is None:
        return {}
    cl.schemas.refresh()
    out = {}
    for t, shape in state.shape_docs.items():
        latest = cl.schemas.latest(t) if t not in state.held else None
        if latest is not None and latest.resync and latest.resync != shape.resync:
            out[t] = latest.resync
    return out
