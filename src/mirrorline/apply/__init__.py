"""Apply: net row changes into targets with set-based bulk statements, exactly once (DESIGN §6).

Every target has the same small interface (:class:`~mirrorline.apply.target.Target`)::

    target = open_target(config.targets["cache"], threads=config.apply.threads)
    target.ensure_schema(schemas)                  # optional: apply() does it for the unit's tables
    state = target.applied_positions()             # unit end + per-table positions; .position is the safe minimum
    result = target.apply(batch, schemas, changes) # a NetBatch; schemas: table -> TableSchema; changes: the raw
                                                   # Change list (or a callable giving it) for the failure path
    target.close()
"""

from __future__ import annotations

from typing import Any

from mirrorline.apply.kinds import KINDS, load
from mirrorline.apply.state import AppliedState
from mirrorline.apply.target import ApplyResult, Needs, Target, deal
from mirrorline.config import TargetConfig
from mirrorline.errors import ConfigError

__all__ = ["AppliedState", "ApplyResult", "Needs", "Target", "deal", "open_target", "target_class"]


def target_class(kind: str) -> type[Target]:
    """The Target class of ``kind`` (:data:`mirrorline.apply.kinds.KINDS`), its module imported now."""
    k = KINDS.get(kind)
    if k is None:
        raise ConfigError("targets", kind, f"no apply target for kind {kind!r} (built: {', '.join(KINDS)})")
    cls: type[Target] = load(k.target)
    return cls


def open_target(cfg: TargetConfig, *, threads: int = 1, needs: Needs | None = None, **options: Any) -> Target:
    """A target from its configuration; ``needs``: what following schema changes needs (the pipeline's).
    ``options``: ``driver_rows`` (units larger than this load table by table), ``parallel_rows`` (PostgreSQL: units
    with at least this many net rows load worktables from Spark tasks), ``open_wait`` (seconds a connection waits
    while another process holds the database; 0: not at all)."""
    cls = target_class(cfg.kind)
    if cfg.catalog:  # a kind with a catalog (kinds.Kind.catalog): the one its [catalog] table names
        options["catalog"] = dict(cfg.catalog)
    return cls(
        cfg.name,
        cfg.location,
        mode=cfg.mode,
        on_error=cfg.on_error,
        threads=threads,
        state_prefix=cfg.state_prefix,
        needs=needs or Needs(history=cfg.history_of),
        **options,
    )
