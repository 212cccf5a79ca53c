"""The one configuration file (TOML, DESIGN §8), loaded and validated: :class:`Config` and its sections, and the
parsing of every section but the targets (:mod:`mirrorline.config.targets`); the values' text forms and the table
reader every section uses are :mod:`mirrorline.config.values`'.

Every problem is refused at start with the file, the key and the reason. Passwords in DSNs are never printed: use
:func:`redact_dsn` on anything that shows a DSN.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorline.config.targets import HISTORY, ON_ERROR, TargetConfig, history_prefix_of, parse_targets
from mirrorline.config.values import Reader, parse_size, parse_threads
from mirrorline.errors import ConfigError

_QUOTED_PART = re.compile(r'"((?:[^"]|"")+)"')


def table_name(text: str) -> str | None:
    """A configured table's name as mirrorline writes it, ``schema.name`` (split at the first dot), from
    ``schema.name`` (any characters but a dot, spaces included) or the quoted SQL form (``sales."Order Items"``,
    ``"Sales"."a.b"``); None when it is neither, or names a schema holding a dot."""
    parts: list[str] = []
    i = 0
    while i <= len(text):
        if text.startswith('"', i):
            m = _QUOTED_PART.match(text, i)
            if m is None:
                return None
            parts.append(m.group(1).replace('""', '"'))
            i = m.end()
        else:
            j = text.find(".", i) if len(parts) == 0 else len(text)
            j = len(text) if j < 0 else j
            part = text[i:j]
            if not part or part != part.strip() or '"' in part or "." in part:  # (a dot in a name: quote it)
                return None
            parts.append(part)
            i = j
        if i == len(text):
            break
        if text[i] != "." or len(parts) > 1:
            return None
        i += 1
    if len(parts) != 2 or "." in parts[0]:
        return None
    return f"{parts[0]}.{parts[1]}"


@dataclass(frozen=True)
class SourceConfig:
    dsn: str = field(repr=False)  # (its password: never printed; redact_dsn where it is shown)
    slot: str = "mirrorline"
    publication: str = "mirrorline"
    # the slot is created as a failover slot (PostgreSQL 17 and later): kept in step on standbys that sync slots, so
    # that capture continues from a promoted standby
    failover: bool = False


@dataclass(frozen=True)
class LogConfig:
    path: Path
    segment_changes: int = 100_000  # close a segment after this many changes ...
    segment_seconds: float = 0.25  # ... or this long after its first change (what a live target waits for at least)
    # a ``snapshot export`` folder not loaded after this long stops holding the log (0: never)
    export_expiry: float = 7 * 86_400.0
    # the log's cap: changes older than max_age seconds, or beyond max_size bytes, are removed even when a target has
    # not applied them (that target then needs a reload); 0: no cap
    max_age: float = 0.0
    max_size: int = 0


@dataclass(frozen=True)
class SparkConfig:
    """Where the compile (and a snapshot's and verify's reading tasks) run. ``master``: None is local with the
    machine's cores; ``conf``: Spark settings passed as they are; ``python``: the interpreter executors run
    mirrorline's Python tasks with (an environment with mirrorline installed, at that path on every worker);
    ``scratch``: the folder for files Spark tasks write and the driver reads (compiled net rows), on storage every
    executor reaches (default: the machine's temporary folder on a local master, the log's folder otherwise)."""

    master: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    scratch: Path | None = None

    @property
    def local(self) -> bool:
        return self.master is None or self.master.startswith("local")

    def master_or_default(self) -> str:
        return self.master or f"local[{os.cpu_count() or 2}]"


@dataclass(frozen=True)
class ApplyConfig:
    latency: float = 2.0  # seconds: close a unit of work once its first change is this old (from its commit) ...
    max_changes: int = 1_000_000  # ... or after this many changes
    threads: int = 1
    builders: int = 1  # the third field of the IBM "threads:latency:builders" form: accepted, unused (Spark sizes)
    on_error: str = "stop"


@dataclass(frozen=True)
class TableConfig:
    name: str  # "schema.name"
    actions: frozenset[str] = frozenset("IDU")
    sequence: int = -1
    key: tuple[str, ...] = ()
    columns: dict[str, str] = field(default_factory=dict)  # column -> PostgreSQL type, for tables fed from files
    # part of a table: only these columns (``columns = [...]``), or all but these (``exclude``), and only the rows
    # for which ``where`` (a PostgreSQL boolean expression on the table's columns) is true: the publication's column
    # list and row filter, the snapshot's and verify's SELECT
    select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    where: str | None = None
    on_schema_change: str = "follow"  # follow the source's schema changes, or stop the target at each one
    dropped_columns: str = "drop"  # a column dropped at the source: drop it at the target, or keep it (then NULL)
    # a partition detached or dropped with its rows (nothing sent): stop the table until it is loaded again, or keep
    # those rows at the targets (an archive of what the source let go)
    detached_partitions: str = "stop"
    # history mode (apply/history.py) at every target, and its columns' prefix; None: each target's own setting
    history: str | None = None
    history_prefix: str | None = None


@dataclass(frozen=True)
class MetricsConfig:
    """``run`` serves its metrics over HTTP for Prometheus to scrape at ``listen`` (host, port); None: it does not."""

    listen: tuple[str, int] | None = None


@dataclass(frozen=True)
class Config:
    file: Path
    source: SourceConfig | None
    log: LogConfig
    apply: ApplyConfig
    tables: dict[str, TableConfig]
    targets: dict[str, TargetConfig]
    spark: SparkConfig = field(default_factory=SparkConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def table(self, name: str) -> TableConfig:
        return self.tables.get(name) or TableConfig(name)

    @property
    def actions(self) -> dict[str, frozenset[str]]:
        """The tables that replicate only some kinds of change (``actions``), with the kinds they replicate."""
        return {t.name: t.actions for t in self.tables.values() if t.actions != frozenset("IDU")}

    def history(self, target: str, table: str) -> tuple[str, str] | None:
        """How ``target`` keeps ``table`` other than as it is now (history mode): (mode, prefix); None: as it is."""
        return self.targets[target].history_of(table)

    def in_versions(self, table: str) -> bool:
        """Does some target keep ``table`` in versions (history mode)?"""
        return any((kept := t.history_of(table)) is not None and kept[0] == "versions" for t in self.targets.values())

    def tables_in_load_order(self) -> list[TableConfig]:
        """DESIGN §7: negative or missing sequence first (any order), then ascending sequence."""
        return sorted(self.tables.values(), key=lambda t: (max(t.sequence, -1), t.name))


def redact_dsn(dsn: str) -> str:
    """Hide the password in a URL or keyword DSN."""
    dsn = re.sub(r"(://[^:/@\s]*:)[^@/\s]*@", r"\1***@", dsn)
    dsn = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn, flags=re.IGNORECASE)
    return re.sub(r"([?&]password=)[^&\s]*", r"\1***", dsn, flags=re.IGNORECASE)


def load(path: str | os.PathLike[str]) -> Config:
    """Load and validate a configuration file; raise :class:`ConfigError` naming file, key and reason."""
    p = Path(path)
    file = str(p)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(file, None, "no such file", hint="pass an existing file with -c/--config") from None
    except OSError as e:
        raise ConfigError(file, None, f"cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(file, None, "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(file, None, f"not valid TOML: {e}") from None
    return parse(data, p)


def parse(data: dict[str, Any], path: Path) -> Config:
    file = str(path)
    base = path.resolve().parent
    top = Reader(file, "", data)
    top.only("source", "log", "apply", "tables", "targets", "spark", "metrics")

    source = None
    if "source" in data:
        r = Reader(file, "source", data["source"])
        r.only("dsn", "slot", "publication", "failover")
        slot = r.get("slot", str, "mirrorline")
        if not re.fullmatch(r"[a-z0-9_]{1,63}", slot):
            raise r.fail("slot", f"{slot!r} is not a valid slot name (lower-case letters, digits and _, at most 63)")
        dsn = r.get("dsn", str, required=True)
        if not dsn.strip():
            raise r.fail("dsn", "is empty")
        dsn = r.expand("dsn", dsn)  # (${NAME}: a password from the environment)
        source = SourceConfig(
            dsn=dsn, slot=slot, publication=r.get("publication", str, slot), failover=r.get("failover", bool, False)
        )

    r = Reader(file, "log", data.get("log", {}))
    r.only("path", "segment_changes", "segment_seconds", "export_expiry", "max_age", "max_size")
    try:
        log_path = storage_path(r.get("path", str, "./mirrorline-log"))
    except ValueError as e:
        raise r.fail("path", str(e)) from None
    seg_changes = r.get("segment_changes", int, 100_000)
    if seg_changes < 1:
        raise r.fail("segment_changes", "must be at least 1")
    seg_seconds = r.duration("segment_seconds", 0.25)
    export_expiry = r.duration("export_expiry", "7d")
    max_age = r.duration("max_age", 0)
    try:
        max_size = parse_size(r.get("max_size", (str, int), 0))
    except ValueError as e:
        raise r.fail("max_size", str(e)) from None
    log = LogConfig(
        path=log_path if log_path.is_absolute() else base / log_path,
        segment_changes=seg_changes,
        segment_seconds=seg_seconds,
        export_expiry=export_expiry,
        max_age=max_age,
        max_size=max_size,
    )

    r = Reader(file, "apply", data.get("apply", {}))
    r.only("latency", "max_changes", "threads", "builders", "on_error")
    try:
        threads, t_latency, t_builders = parse_threads(r.get("threads", (int, str), 1))
    except ValueError as e:
        raise r.fail("threads", str(e)) from None
    latency = r.duration("latency", t_latency if t_latency is not None else 2.0)
    max_changes = r.get("max_changes", int, 1_000_000)
    if max_changes < 1:
        raise r.fail("max_changes", "must be at least 1")
    builders = r.get("builders", int, t_builders or 1)
    if builders < 1:
        raise r.fail("builders", "must be at least 1")
    on_error = r.get("on_error", str, "stop")
    if on_error not in ON_ERROR:
        raise r.fail("on_error", f"expected one of {', '.join(ON_ERROR)}, got {on_error!r}")
    apply = ApplyConfig(latency=latency, max_changes=max_changes, threads=threads, builders=builders, on_error=on_error)

    tables: dict[str, TableConfig] = {}
    r = Reader(file, "tables", data.get("tables", {}))
    for text, spec in r.data.items():
        name = table_name(text)
        if name is None:
            raise r.fail(
                text,
                'table names are "schema.name" (e.g. [tables."public.orders"], [tables."sales.Order Items"]) or '
                "quoted as in SQL (e.g. [tables.'sales.\"Order Items\"']); a schema name holding a dot is not "
                "supported",
            )
        if name in tables:
            raise r.fail(text, f"names the table {name} a second time")
        tables[name] = _table(file, name, spec)

    targets = parse_targets(file, base, data.get("targets", {}), on_error)
    own = tuple(
        (t.name, t.history or "", t.history_prefix or "") for t in tables.values() if t.history or t.history_prefix
    )
    if own:
        targets = {n: dataclasses.replace(tc, table_history=own) for n, tc in targets.items()}

    spark = _spark(file, base, data.get("spark", {}), log.path)
    r = Reader(file, "metrics", data.get("metrics", {}))
    r.only("listen")
    listen = r.get("listen", str, "")
    address: tuple[str, int] | None = None
    if listen:
        m = re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]*):(\d{1,5})", listen.strip())
        if not m or not 0 < int(m.group(2)) < 65536:
            raise r.fail("listen", f'expected "host:port" such as "127.0.0.1:7361", got {listen!r}')
        address = (m.group(1).strip("[]") or "0.0.0.0", int(m.group(2)))
    return Config(
        file=path,
        source=source,
        log=log,
        apply=apply,
        tables=tables,
        targets=targets,
        spark=spark,
        metrics=MetricsConfig(address),
    )


_MASTER_RE = re.compile(r"^(local(\[(\d+|\*)(,\d+)?\])?|spark://[^/\s]+|yarn|k8s://\S+|mesos://\S+)$")


def _spark(file: str, base: Path, data: Any, log_path: Path) -> SparkConfig:
    r = Reader(file, "spark", data)
    r.only("master", "conf", "python", "scratch")
    master = r.get("master", str, None)
    if master is not None and not _MASTER_RE.match(master):
        raise r.fail(
            "master",
            f'{master!r} is not a Spark master URL: expected "local[N]", "spark://host:port", "yarn" or "k8s://..."',
        )
    conf_raw = r.get("conf", dict, {})
    conf: dict[str, str] = {}
    for k, v in conf_raw.items():
        if not isinstance(v, str | int | float | bool) or not k.startswith("spark."):
            raise r.fail(f"conf.{k}", "expected a Spark setting (spark.*) with a string, number or boolean value")
        conf[k] = str(v).lower() if isinstance(v, bool) else str(v)
    python = r.get("python", str, None)
    if python is not None and not python.strip():
        raise r.fail("python", "is empty")
    scratch = None
    if "scratch" in r.data:
        try:
            scratch = storage_path(r.get("scratch", str))
        except ValueError as e:
            raise r.fail("scratch", str(e)) from None
        scratch = scratch if scratch.is_absolute() else base / scratch
    elif master is not None and not master.startswith("local"):
        scratch = log_path / "scratch"  # the executors write net rows there and the driver reads them
    return SparkConfig(master=master, conf=conf, python=python, scratch=scratch)


# schemes Spark knows and mirrorline cannot use for its own files, and why
_UNUSABLE = {
    "hdfs": "no Hadoop filesystem client is installed for mirrorline's own writes (capture's segments need an "
    "atomic rename and fsync)",
    "s3": "an object store has no atomic rename, which publishing segments and units needs",
    "s3a": "an object store has no atomic rename, which publishing segments and units needs",
    "gs": "an object store has no atomic rename, which publishing segments and units needs",
    "abfs": "an object store has no atomic rename, which publishing segments and units needs",
    "abfss": "an object store has no atomic rename, which publishing segments and units needs",
    "wasb": "an object store has no atomic rename, which publishing segments and units needs",
}


def storage_path(text: str) -> Path:
    """A storage location as a path: a path, or a ``file://`` URL (a folder every executor mounts at the same
    path, e.g. NFS). Other schemes are refused with the reason."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", text)
    if not m:
        return Path(text)
    scheme = m.group(1).lower()
    if scheme == "file":
        rest = text[len("file://") :]
        if not rest.startswith("/"):
            raise ValueError(f"expected file:///absolute/path, got {text!r}")
        return Path(rest)
    why = _UNUSABLE.get(scheme, "no filesystem for that scheme is installed")
    raise ValueError(
        f"{scheme}:// cannot hold mirrorline's files: {why}; use a local path, or a file:/// URL of a filesystem "
        "every Spark executor mounts at the same path (NFS, a cluster filesystem)"
    )


def _table(file: str, name: str, spec: Any) -> TableConfig:
    r = Reader(file, f'tables."{name}"', spec)
    r.only(
        "actions",
        "sequence",
        "key",
        "columns",
        "exclude",
        "where",
        "on_schema_change",
        "dropped_columns",
        "detached_partitions",
        "history",
        "history_prefix",
    )
    actions = r.get("actions", str, "IDU").upper()
    history = r.get("history", str, None)
    if history is not None and history not in HISTORY:
        raise r.fail("history", f"expected one of {', '.join(map(repr, HISTORY))}, got {history!r}")
    history_prefix = history_prefix_of(r)
    on_schema_change = r.get("on_schema_change", str, "follow")
    if on_schema_change not in ("follow", "stop"):
        raise r.fail("on_schema_change", f'expected "follow" or "stop", got {on_schema_change!r}')
    dropped_columns = r.get("dropped_columns", str, "drop")
    if dropped_columns not in ("drop", "keep"):
        raise r.fail("dropped_columns", f'expected "drop" or "keep", got {dropped_columns!r}')
    detached = r.get("detached_partitions", str, "stop")
    if detached not in ("stop", "keep"):
        raise r.fail("detached_partitions", f'expected "stop" or "keep", got {detached!r}')
    if not actions or any(a not in "IDU" for a in actions):
        raise r.fail("actions", f'expected letters among I, D and U (e.g. "IDU"), got {actions!r}')
    sequence = r.get("sequence", int, -1)
    key = r.get("key", list, [])
    if not all(isinstance(k, str) and k for k in key):
        raise r.fail("key", "expected a list of column names")
    if len(set(key)) != len(key):
        raise r.fail("key", "names a column twice")
    columns = r.get("columns", (dict, list), {})
    select: list[str] = []
    if isinstance(columns, list):  # the columns to replicate (a table of names and types: a table fed from files)
        select, columns = columns, {}
        if not select or not all(isinstance(c, str) and c for c in select) or len(set(select)) != len(select):
            raise r.fail("columns", "expected a list of the column names to replicate, each once")
    exclude = r.get("exclude", list, [])
    if not all(isinstance(c, str) and c for c in exclude) or len(set(exclude)) != len(exclude):
        raise r.fail("exclude", "expected a list of the column names to leave out, each once")
    if select and exclude:
        raise r.fail("exclude", "give either columns = [...] (the ones to replicate) or exclude = [...], not both")
    where = r.get("where", str, None)
    if where is not None and not where.strip():
        raise r.fail("where", 'expected a PostgreSQL boolean expression on the table\'s columns, such as "amount > 0"')
    for col, typ in columns.items():
        if not isinstance(typ, str) or not typ.strip():
            raise r.fail(f"columns.{col}", 'expected a PostgreSQL type name such as "bigint" or "text"')
    missing = [k for k in key if columns and k not in columns]
    if missing:
        raise r.fail("key", f"names columns not in columns: {', '.join(missing)}")
    return TableConfig(
        name=name,
        actions=frozenset(actions),
        sequence=max(sequence, -1),
        key=tuple(key),
        columns=dict(columns),
        select=tuple(select),
        exclude=tuple(exclude),
        where=where.strip() if where is not None else None,
        on_schema_change=on_schema_change,
        dropped_columns=dropped_columns,
        detached_partitions=detached,
        history=history,
        history_prefix=history_prefix,
    )
