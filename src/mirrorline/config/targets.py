"""The ``[targets.NAME]`` sections of the configuration: each target's URL (its kind, from the kinds' registry
:mod:`mirrorline.apply.kinds`, and its location: a path for a file target, relative to the configuration file's folder,
or a DSN), its mode, what it does with a change it cannot apply, how it is first loaded, and the upkeep its kind needs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorline.config.values import Reader

MODES = ("update", "mirror")
ON_ERROR = ("stop", "reject")


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str
    kind: str  # a name in mirrorline.apply.kinds.KINDS
    location: str = field(repr=False)  # a path for file targets, a DSN for PostgreSQL (its password: never printed)
    mode: str = "update"
    on_error: str = "stop"
    # a table that fails stops the whole target (its units then apply whole or not at all), not that table alone
    all_or_nothing: bool = False
    compact_every: float = 0.0  # Delta: seconds between compactions and cleanups while run is live (0: never)
    retention_hours: int = 168  # Delta: files no version younger than this reads are removed by the cleanup
    # how the target is first loaded: "wire" (run snapshots it) or "files" (snapshot export, carried over, then
    # snapshot load: run keeps the log for it and waits; seed 001's manual transfer)
    initial: str = "wire"
    # the prefix of mirrorline's own tables at the target (mirrorline_applied, _snapshot, _rejects): two instances
    # sharing one target database each take their own
    state_prefix: str = "mirrorline_"
    # a kind with a catalog (kinds.Kind.catalog): the properties of the catalog its tables are in, values taken from
    # the environment where written ${NAME} (never printed); empty: the kind's embedded catalog
    catalog: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # history mode of its tables unless a table says otherwise: "none" (the rows as they are now), "versions"
    # (every version of each row) or "soft_delete" (rows deleted at the source kept, marked): apply/history.py; the
    # names of the columns it adds start with history_prefix
    history: str = "none"
    history_prefix: str = "_ml_"
    # the tables whose [tables] entry says otherwise: (table, history, prefix or "")
    table_history: tuple[tuple[str, str, str], ...] = ()

    def history_of(self, table: str) -> tuple[str, str] | None:
        """How this target keeps ``table`` other than as it is now (history mode): (mode, the prefix of its
        columns); None: as it is now."""
        mode, prefix = self.history, self.history_prefix
        for name, m, p in self.table_history:
            if name == table:
                mode, prefix = m or mode, p or prefix
        return (mode, prefix) if mode != "none" else None


HISTORY = ("none", "versions", "soft_delete")


def history_prefix_of(r: Reader) -> str | None:
    """``history_prefix`` as given (None: not given): letters, digits and _, starting with a letter or _."""
    prefix = r.get("history_prefix", str, None)
    if prefix is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,29}", prefix):
        raise r.fail(
            "history_prefix", f"expected letters, digits and _ (at most 30), not starting with a digit, got {prefix!r}"
        )
    return prefix


def target_location(url: str, base: Path) -> tuple[str, str]:
    """Split a target URL into (kind, location). File URLs follow the SQLAlchemy convention: ``sqlite:///cache.db``
    is relative to the configuration file's folder, ``sqlite:////var/cache.db`` is absolute."""
    from mirrorline.apply.kinds import KINDS, by_scheme

    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    kind = by_scheme(scheme)
    names = ", ".join(KINDS)
    if kind is None and scheme == "parquet":
        raise ValueError(
            f"there is no parquet target kind (for a lake table use delta:///path): expected one of {names}"
        )
    if kind is None:
        raise ValueError(f"unknown target kind {scheme or url!r}: expected one of {names}")
    if not kind.path:
        return kind.name, url
    rest = url[len(scheme) + 1 :]
    if not rest.startswith("///"):
        raise ValueError(f"expected {scheme}:///relative/path or {scheme}:////absolute/path, got {url!r}")
    path = rest[3:]
    if not path:
        raise ValueError(f"no path in {url!r}")
    p = Path(path)
    return kind.name, str(p if p.is_absolute() else (base / p))


def parse_targets(file: str, base: Path, data: Any, on_error: str) -> dict[str, TargetConfig]:
    """The ``[targets]`` table of configuration file ``file`` (in folder ``base``); ``on_error``: ``[apply]``'s, the
    targets' default."""
    targets: dict[str, TargetConfig] = {}
    r = Reader(file, "targets", data)
    for name, spec in r.data.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", name):
            raise r.fail(name, "target names are letters, digits, _ and -, at most 40")
        t = Reader(file, f"targets.{name}", spec)
        t.only(
            "url",
            "mode",
            "on_error",
            "all_or_nothing",
            "compact_every",
            "vacuum_retention",
            "initial",
            "state_prefix",
            "catalog",
            "history",
            "history_prefix",
        )
        url = t.get("url", str, required=True)
        secret = t.expand("url", url)  # (${NAME}: a password from the environment; the URL kept as written)
        try:
            kind, location = target_location(secret, base)
        except ValueError as e:
            raise t.fail("url", str(e)) from None
        mode = t.get("mode", str, "update")
        if mode not in MODES:
            raise t.fail("mode", f"expected one of {', '.join(MODES)}, got {mode!r}")
        t_on_error = t.get("on_error", str, on_error)
        if t_on_error not in ON_ERROR:
            raise t.fail("on_error", f"expected one of {', '.join(ON_ERROR)}, got {t_on_error!r}")
        state_prefix = t.get("state_prefix", str, "mirrorline_")
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,29}", state_prefix):
            raise t.fail(
                "state_prefix", f"expected lower-case letters, digits and _ (at most 30), got {state_prefix!r}"
            )
        initial = t.get("initial", str, "wire")
        if initial not in ("wire", "files"):
            raise t.fail("initial", f'expected "wire" (loaded by run) or "files" (snapshot load), got {initial!r}')
        from mirrorline.apply.kinds import KINDS

        upkeep: dict[str, Any] = {}
        if KINDS[kind].compacts:
            upkeep["compact_every"] = t.duration("compact_every", "1h")
            retention = t.duration("vacuum_retention", "168h")
            if retention < 3600:
                raise t.fail(
                    "vacuum_retention",
                    "must be at least 1h: a reader of an older version (or a unit being applied) still needs its files",
                )
            upkeep["retention_hours"] = math.ceil(retention / 3600)
        else:
            for key in ("compact_every", "vacuum_retention"):
                if key in t.data:
                    raise t.fail(key, f"{KINDS[kind].what} has no files to compact and clean up")
        catalog = _catalog(t, KINDS[kind]) if "catalog" in t.data else ()
        history = t.get("history", str, "none")
        if history not in HISTORY:
            raise t.fail("history", f"expected one of {', '.join(map(repr, HISTORY))}, got {history!r}")
        history_prefix = history_prefix_of(t)
        targets[name] = TargetConfig(
            name=name,
            url=url,
            kind=kind,
            location=location,
            mode=mode,
            on_error=t_on_error,
            all_or_nothing=t.get("all_or_nothing", bool, False),
            initial=initial,
            state_prefix=state_prefix,
            catalog=catalog,
            history=history,
            history_prefix=history_prefix or "_ml_",
            **upkeep,
        )
    return targets


def _catalog(t: Reader, kind: Any) -> tuple[tuple[str, str], ...]:
    """A target's ``[targets.X.catalog]`` table: string properties, ``${NAME}`` in a value read from the environment
    when the configuration is read (a missing variable is an error naming it, never its value)."""
    if not kind.catalog:
        raise t.fail("catalog", f"{kind.what} has no catalog")
    data = t.data["catalog"]
    if not isinstance(data, dict) or not data:
        raise t.fail("catalog", "expected a table of the catalog's properties (type, uri, warehouse, ...)")
    out = []
    for key, value in data.items():
        if not isinstance(value, str | int | float | bool):
            raise t.fail(f"catalog.{key}", "expected a string")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out.append((str(key), t.expand(f"catalog.{key}", text)))
    return tuple(out)
