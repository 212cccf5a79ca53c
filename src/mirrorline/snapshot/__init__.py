"""Initial update (DESIGN §7): consistent snapshots over the wire or through files, target states, and the
reconciliation of targets with the configuration at start.

What other stages use::

    from mirrorline.snapshot import snapshot_target, export_snapshot, load_snapshot, reconcile_targets
    snapshot_target(config, "cache")                  # a consistent initial load; applied position = its point
    snapshot_target(config, "cache", tables=["public.new"])   # just these tables, into a live target
    export_snapshot(config, "/media/dvd")             # -> SnapshotResult(folder=.../<timestamp>)
    load_snapshot(config, "cache", folder)            # checks everything first, then loads in one transaction
    reconcile_targets(config)                         # at start: new targets / added tables loaded; removed left
    target_states(config)                             # see mirrorline.status

For ``verify``, the consistent-read building blocks: ``tables_at`` (the tables at a consistent point),
``run_tasks`` (chunk tasks under its snapshot), ``check_rewritten`` / ``Rewritten`` / ``retrying`` / ``ATTEMPTS``
(a table rewritten under the snapshot: take a new point), ``target_config``.
"""

from mirrorline.snapshot.files import export_snapshot, load_snapshot
from mirrorline.snapshot.folder import Manifest, check_folder
from mirrorline.snapshot.jobs import ATTEMPTS, Rewritten, check_rewritten, retrying, run_tasks
from mirrorline.snapshot.plan import SEQ_MAX, consistent_position, point_of
from mirrorline.snapshot.run import (
    Options,
    SnapshotResult,
    TargetReconcile,
    missing_tables,
    needs_load,
    reconcile_targets,
    snapshot_target,
    tables_at,
    target_config,
)
from mirrorline.snapshot.state import CATCHING_UP, LIVE, LOADING, NEW

__all__ = [
    "ATTEMPTS",
    "CATCHING_UP",
    "LIVE",
    "LOADING",
    "NEW",
    "SEQ_MAX",
    "Manifest",
    "Options",
    "Rewritten",
    "SnapshotResult",
    "TargetReconcile",
    "check_folder",
    "check_rewritten",
    "consistent_position",
    "export_snapshot",
    "load_snapshot",
    "missing_tables",
    "needs_load",
    "point_of",
    "reconcile_targets",
    "retrying",
    "run_tasks",
    "snapshot_target",
    "tables_at",
    "target_config",
]
