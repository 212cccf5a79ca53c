"""Tables held at a target: a table a target refused (a value, a row, a schema change) is stopped alone there,
recorded in the target's state (:mod:`mirrorline.apply.state`), while the target's other tables go on (DESIGN §6).
When its delay has passed, the table is tried again in units of its own, from its own position towards the target's
other tables, taking turns with the live units; its hold ends once it reaches them.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

from mirrorline.apply.reshape import ResyncStop
from mirrorline.apply.target import TargetMoved
from mirrorline.errors import MirrorlineError, Unverified
from mirrorline.pipeline.roster import Roster
from mirrorline.pipeline.targets import loading
from mirrorline.pipeline.units import UnitReport, Units
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.apply import AppliedState

log = logging.getLogger(__name__)


def _stopped_before(name: str, table: str, st: AppliedState) -> Exception:
    """The error of a table held before this process started, from the reason its target's state keeps."""
    reason = st.holds.get(table, {})
    why = reason.get("error") or "stopped"
    kind = ResyncStop if reason.get("kind") == ResyncStop.__name__ else MirrorlineError
    return kind(
        f"{why} (table {table} at target {name}, stopped since {reason.get('since', '?')})",
        hint=f"fix the target's table, or reload it: mirrorline snapshot --target {name} --table {table}",
        target=name,
        table=table,
    )


def due(roster: Roster, states: dict[str, AppliedState], retry: bool) -> list[tuple[str, str]]:
    """The held tables to try now: due (their delay passed, or held before this process started: tried once now)."""
    now = time.monotonic()
    out = []
    for n, st in states.items():
        for t in st.held:
            f = roster.held.get((n, t)) or roster.held.stopped((n, t), _stopped_before(n, t, st))
            if f.due(now, retry):
                out.append((n, t))
    return out


def released(roster: Roster, states: dict[str, AppliedState]) -> None:
    """Forget the holds the targets' states no longer have (a snapshot reloaded the table, or this process ended
    the hold)."""
    roster.held.drop(lambda key: key[0] in states and key[1] not in states[key[0]].held)


def unit(
    roster: Roster, units: Units, states: dict[str, AppliedState], limit: Position, retry: bool
) -> UnitReport | None:
    """One unit of a held table that is due, from its own position towards the target's other tables (at most to
    ``limit``); the table's hold ends once it reaches them. None: no held table is due, none had anything to apply,
    or the unit failed (the table stays held, or its target stopped: :meth:`Roster.failure`)."""
    for n, t in due(roster, states, retry):
        guard = roster.table_lock((n, t))
        if not guard.acquire(blocking=False):  # this process loads it again now (run's reload): the load ends the hold
            continue
        try:
            st = states[n]
            start, end_cap = st.table(t), min(st.live, limit)
            target = roster.targets[n]
            f = roster.held.get((n, t))
            if f is None:
                continue
            if loading(target, t):  # a snapshot loads it now (snapshot --table, or run's reload): it ends the hold
                roster.held.later((n, t), roster.held.first)
                continue
            if start >= st.live:  # nothing left to catch up
                try:
                    with target.exclusive(roster.lock_wait):
                        target.release(t)
                except Exception as e:
                    roster.fail(n, e, None)
                    return None
                roster.held.pop((n, t))
                log.info("target %s: table %s applies again", n, t)
                continue
            if start >= end_cap:
                continue
            u = units.next_unit(start, end_cap)
            n_changes = u.changes
            end = u.end if u.end is not None and not u.empty and n_changes > 0 else end_cap
            if not f.trying:
                log.info("target %s: trying table %s again, from %s", n, t, start)
                f.trying = True
            batch, compiled, seconds = units.compile(start, end, False, empty=n_changes == 0)
            report = UnitReport(
                start, end, batch.changes if n_changes < 0 else n_changes, [n], compiled, seconds, {}, table=t
            )
            schemas = units.unit_schemas(batch)
            t0 = time.monotonic()
            try:
                try:
                    with target.exclusive(roster.lock_wait):
                        report.results[n] = target.apply(
                            batch, schemas, functools.partial(units.changes, start, end), table=t
                        )
                except Unverified as e:
                    batch = units.compiler.again(batch, e)
                    with target.exclusive(roster.lock_wait):
                        report.results[n] = target.apply(
                            batch, schemas, functools.partial(units.changes, start, end), table=t
                        )
                report.apply_seconds[n] = time.monotonic() - t0
            except TargetMoved as e:  # another process moved the table meanwhile: formed again at the next step
                log.info("%s", e)
                return None
            except Exception as e:
                roster.failure(n, e, batch, spared=set(), only=t)
                return None
            finally:
                batch.release()
            roster.held.again_now((n, t))  # it applies: due again at once, taking turns with the live units
            if end >= st.live:
                roster.held.pop((n, t))
                log.info("target %s: table %s caught up with the other tables: it applies again", n, t)
            else:
                log.info("unit %s..%s (%d changes) applied to table %s at %s", start, end, report.changes, t, n)
            return report
        finally:
            guard.release()
    return None
