"""The applier's roster: each target's life in the pipeline as one value (:class:`Phase`), its transitions, and the
one failure handler that decides whether an error stops a table alone at a target or the whole target (DESIGN §6:
a failure stops only itself; the others go on, and what failed is tried again: :mod:`mirrorline.pipeline.backoff`).

::

    loading ──admit──▶ new ──(next step: opened)──▶ joining ──(reached the others)──▶ live ◀──▶ a table held
                                                       ▲  │                              │
                                       (delay passed)  │  └────────── failed ◀───────────┘
                                                       └──────────────┘
    pause: paused ──(next step)──▶ out, until admitted again;  remove / needs a reload: removed

Requests from other threads (``run`` loading a target beside the others, or loading tables added to one) take the
roster's lock and take effect at the applier's next step (:meth:`Roster.take_requests`); everything else happens in
the applier's own thread.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from mirrorline import stopped
from mirrorline.errors import first_line
from mirrorline.pipeline.backoff import Backoffs
from mirrorline.pipeline.targets import failing_table
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.apply import Target
    from mirrorline.compile.batch import NetBatch
    from mirrorline.config import Config

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    """Where a target is in its life in the pipeline."""

    LOADING = "loading"  # ``run`` loads it beside the others: not applied to until admitted
    NEW = "new"  # loaded and admitted: opened and added at the next step
    JOINING = "joining"  # catching up with the others (added, or tried again after a failure), taking turns
    LIVE = "live"  # applied to with the others
    HELD = "a table held"  # live, with one or more of its tables stopped alone
    FAILED = "failed"  # stopped by an error; tried again after its delay
    PAUSED = "paused"  # taken out at the next step (``run`` loads tables added to it), added again once loaded
    REMOVED = "removed"  # no longer applied: removed from the configuration, or it needs a reload


class Roster:
    """The targets one applier applies to, each with its phase; the targets stopped by an error (:attr:`failed`)
    and the tables stopped alone at a target (:attr:`held`), each with its backoff."""

    lock_wait = 30.0  # seconds a hold waits for another process (verify, apply) to let go of the target

    def __init__(self, config: Config, names: list[str], given: dict[str, Target] | None = None) -> None:
        self.config = config
        self.names = list(names)  # the targets this pipeline applies to (opened: :attr:`targets`)
        self.targets: dict[str, Target] = dict(given or {})  # the targets applied to, opened
        self._phase: dict[str, Phase] = {n: Phase.LIVE for n in self.targets}
        self._given = set(self.targets)  # opened (and closed) by the caller
        self.failed: Backoffs[str] = Backoffs()  # targets stopped by an error
        self.held: Backoffs[tuple[str, str]] = Backoffs()  # tables stopped alone at a target, by (target, table)
        self._recorded: set[str] = set()  # targets with a stop record (for ``status``) to clear once they apply
        self._requests = threading.Lock()
        self._loading: set[str] = set()
        self._table_locks: dict[tuple[str, str], threading.Lock] = {}
        self._admitted: list[str] = []
        self._paused: list[tuple[str, threading.Event]] = []

    def table_lock(self, key: tuple[str, str]) -> threading.Lock:
        """The lock of one table at one target (``(target, table)``) that this process's load of it holds from
        before it empties the table to its end, and a unit of the table held there holds from its look at the
        table's snapshot state to its commit: the unit never applies rows into a table the load has emptied and is
        filling (the load's rows would then hold them twice)."""
        with self._requests:
            return self._table_locks.setdefault(key, threading.Lock())

    # -- membership --------------------------------------------------------------------------------------------

    def add(self, name: str, target: Target, *, joining: bool = False) -> None:
        self.targets[name] = target
        self._phase[name] = Phase.JOINING if joining else Phase.LIVE
        if name not in self.names:
            self.names.append(name)

    def recorded(self, names: set[str]) -> None:
        """``names`` have a stop record from before this process: cleared once each applies."""
        self._recorded |= names & set(self.names)

    def remove(self, name: str) -> Target | None:
        """``name`` is no longer applied to (closed, unless the caller opened it); returns it."""
        target = self.targets.pop(name, None)
        self._phase.pop(name, None)
        if name in self.names:
            self.names.remove(name)
        with self._requests:
            self._loading.discard(name)
        self.failed.pop(name)
        self.held.drop(lambda key: key[0] == name)
        if target is not None and name not in self._given:
            target.close()
        return target

    def close(self) -> None:
        for n, t in self.targets.items():
            if n not in self._given:
                t.close()

    # -- requests from other threads ---------------------------------------------------------------------------

    def loading(self, name: str) -> None:
        """``run`` loads ``name`` beside the others now."""
        with self._requests:
            self._loading.add(name)

    def admit(self, name: str) -> None:
        """``name`` was loaded while the others applied: added at the next step, catching up with them."""
        with self._requests:
            self._loading.discard(name)
            self._admitted.append(name)

    def pause(self, name: str) -> threading.Event:
        """Take ``name`` out at the next step; the event is set once it is out."""
        out = threading.Event()
        with self._requests:
            self._paused.append((name, out))
        return out

    def requested(self) -> bool:
        with self._requests:
            return bool(self._admitted or self._paused)

    def take_requests(self, open_target: Callable[[str], Target]) -> None:
        """The applier's thread, at a step: targets paused are taken out, targets admitted opened and added."""
        with self._requests:
            paused, self._paused = self._paused, []
            admitted, self._admitted = self._admitted, []
        for name, out in paused:
            self.remove(name)
            out.set()
        for n in admitted:
            if n not in self.targets:
                self.add(n, open_target(n), joining=True)
                log.info("target %s loaded: it catches up with the others", n)

    # -- phases ------------------------------------------------------------------------------------------------

    def phases(self) -> dict[str, Phase]:
        """Each target's phase now, the requested ones included (from any thread)."""
        held = {k[0] for k in self.held}
        out = {n: Phase.HELD if p is Phase.LIVE and n in held else p for n, p in dict(self._phase).items()}
        with self._requests:
            out.update({n: Phase.LOADING for n in self._loading})
            out.update({n: Phase.NEW for n in self._admitted})
            out.update({n: Phase.PAUSED for n, _ in self._paused})
        return out

    def joining(self) -> set[str]:
        return {n for n, p in self._phase.items() if p is Phase.JOINING}

    def joined(self, positions: dict[str, Position]) -> None:
        """Targets catching up that reached the others' lowest position are live (all of them, when none is live)."""
        joining = self.joining() & set(positions)
        if not joining:
            return
        others = [p for n, p in positions.items() if n not in joining]
        for n in joining:
            if not others or positions[n] >= min(others):
                self._phase[n] = Phase.LIVE

    def ready(self, now: float, retry: bool) -> list[str]:
        """The targets to apply to now: not stopped, or stopped and due to be tried again (then they catch up with
        the others, taking turns with them)."""
        out = []
        for n in self.targets:
            f = self.failed.get(n)
            if f is None:
                out.append(n)
            elif f.due(now, retry):
                if not f.trying:  # (due until it fails again, or applies)
                    log.info("target %s: trying it again", n)
                    f.trying = True
                    self._phase[n] = Phase.JOINING
                out.append(n)
        return out

    # -- failures ----------------------------------------------------------------------------------------------

    def fail(self, name: str, error: Exception, position: Position | None) -> None:
        """``name`` failed (applying the unit ending at ``position``, or being read): it stops alone, recorded for
        ``status``, and is tried again after a delay that doubles with each failure."""
        delay = self.failed.fail(name, error).delay
        stopped.record(self.config.log.path, name, error, str(position) if position is not None else "")
        self._recorded.add(name)
        if name in self._phase:
            self._phase[name] = Phase.FAILED
        text = first_line(error)
        log.error("target %s stopped: %s (the other targets go on; trying it again in %.0f s)", name, text, delay)

    def recovered(self, name: str) -> None:
        """``name`` applied (or has nothing to apply): no longer stopped."""
        if self.failed.pop(name) is not None:
            log.info("target %s applies again", name)
            if self._phase.get(name) is Phase.FAILED:
                self._phase[name] = Phase.JOINING
        if name in self._recorded:
            stopped.clear(self.config.log.path, name)
            self._recorded.discard(name)

    def hold(self, name: str, table: str, error: Exception) -> None:
        """Stop ``table`` alone at target ``name`` (its other tables go on): held in the target's state, so that a
        restart keeps it stopped, and tried again after a delay that doubles with each failure."""
        target = self.targets[name]
        with target.exclusive(self.lock_wait):
            at = target.hold(table, error)
        delay = self.held.fail((name, table), error).delay
        text = first_line(error).removeprefix(f"target {name}: ")
        log.error(
            "target %s: table %s stopped at %s: %s (the target's other tables go on; trying it again in %.0f s)",
            name,
            table,
            at,
            text,
            delay,
        )

    def failure(
        self, name: str, error: Exception, batch: NetBatch, *, spared: set[str], only: str | None = None
    ) -> str | None:
        """The one failure handler: ``name`` failed applying ``batch`` with ``error``. A table the error is about
        (:func:`failing_table`) stops alone, and its name is returned: the caller applies the unit again without
        it. Otherwise (the error is not one table's, the table was stopped already in this unit (``spared``), it is
        not ``only``, the table a held unit applies, or its hold cannot be written) the target stops, and None is
        returned. An error of the unit's compile (:meth:`NetBatch.verify` raises it) is no target's: it is raised."""
        batch.verify()
        table = failing_table(self.config.targets[name], error, batch)
        if table is not None and table not in spared and (only is None or table == only):
            try:
                self.hold(name, table, error)
                return table
            except Exception as e:  # (the hold could not be written: the target's)
                error = e
        self.fail(name, error, batch.end)
        return None
