"""Applying the log to one target from its applied position up to a given position: what a loaded target does to
catch up, and what ``verify`` does to bring a target to the exact position it compares at. The pipeline's own unit
loop (:meth:`mirrorline.pipeline.Applier.catch_up`) does it: the same units (never straddling a per-table applied
position above the unit's start, so that a table snapshotted into a live target skips the changes its snapshot holds),
the same compile routes, stored units and log statistics, the same failure path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mirrorline.apply.engine import Target
from mirrorline.config import Config
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.pipeline import UnitReport


def catch_up(
    config: Config,
    name: str,
    upto: Position | None = None,
    *,
    target: Target | None = None,
    on_unit: Callable[[UnitReport], None] | None = None,
    held_ok: bool = False,
) -> Position:
    """Apply the log's changes of the configured tables to target ``name`` after its applied position, up to
    ``upto`` (default: everything the log holds now); returns the applied position. An ``upto`` given is one the log
    is known to hold every change up to (the caller made sure capture passed it): the target's position becomes
    ``upto`` itself, beyond the log's last change if need be. ``target``: that target already open (left open).
    ``held_ok``: a table stopped alone at the target (:mod:`mirrorline.apply.state`) is not an error: the other
    tables reach ``upto``."""
    from mirrorline.pipeline import Applier

    applier = Applier(config, [name], open_targets=target is None)
    if target is not None:
        applier.targets = {name: applier.wire(target)}
    try:
        applier.catch_up(upto, on_unit=on_unit, covered=upto is not None, held_ok=held_ok)
        return applier.targets[name].applied_positions().position
    finally:
        if target is not None:
            applier.targets = {}  # the caller's: it closes it
        applier.close()
