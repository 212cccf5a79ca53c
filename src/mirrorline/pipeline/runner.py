"""``mirrorline run``: capture and apply in one process (DESIGN §1). Capture runs in a thread of its own; the
applier follows the log it writes; targets that are new are loaded beside (snapshot) while the others apply, then
join them; the configuration is reloaded on SIGHUP; tables a partition event stopped are loaded again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mirrorline import config as config_mod
from mirrorline import stopped
from mirrorline.apply.reshape import ResyncStop
from mirrorline.capture.source import connect, describe_tables
from mirrorline.config import Config
from mirrorline.errors import MirrorlineError, first_line
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import needs_reload, readers, reload_reason, set_applied, unconfigured, unregister
from mirrorline.log.writer import announce_run
from mirrorline.metrics import RunMetrics
from mirrorline.pipeline.ahead import AheadApplier
from mirrorline.pipeline.applier import Applier
from mirrorline.pipeline.backoff import Backoffs
from mirrorline.pipeline.units import UnitReport, known_bags
from mirrorline.position import Position
from mirrorline.snapshot import needs_load, reconcile_targets, snapshot_target
from mirrorline.sparkenv import get_spark

if TYPE_CHECKING:
    from mirrorline.compile.warmup import WarmUp

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    captured: int = 0
    units: int = 0
    applied: int = 0
    positions: dict[str, Position] = field(default_factory=dict)


class Runner:
    """``mirrorline run``: capture in a thread of its own, apply in this one. Either failing stops both; the error
    of the one that failed is raised. Positions stay consistent whatever the stop: the log only holds committed
    transactions, and each target's position is committed with its data."""

    def __init__(
        self,
        config: Config,
        *,
        once: bool = False,
        on_unit: Callable[[UnitReport], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        forget_removed: bool = False,
    ) -> None:
        """``forget_removed``: unregister from the log the targets no longer configured (else they keep holding it,
        with a warning), as ``mirrorline target drop`` does."""
        from mirrorline.capture.session import Capture

        self.config = config
        self.log = ChangeLog(config.log.path)  # the change log every step reads (it need not exist yet)
        self.once = once
        self._bags: dict[str, tuple[str, ...]] | None = None  # the tables without a key the warm-up built plans for
        self.forget_removed = forget_removed
        self.on_unit = on_unit
        self.on_message = on_message or (lambda m: log.info("%s", m))
        self._ready = threading.Event()
        self.capture = Capture(config, once=once, on_ready=lambda _stats: self._ready.set())
        self._ahead = AheadApplier()  # streamed transactions applied ahead of their commit (pipeline/ahead.py)
        self.capture.stream_watcher = self._ahead
        self._capture_thread: threading.Thread | None = None
        self._restarting = False  # capture is being started again with a reloaded configuration
        self.result = RunResult()
        self._stop = threading.Event()
        self._capture_error: BaseException | None = None
        self._capture_done = threading.Event()
        self.loaded = threading.Event()  # set once new targets and tables are loaded
        self._load_error: BaseException | None = None
        self._positions: dict[str, Position] = {}  # each applying target's position, for the metrics
        self.metrics: Any = None  # RunMetrics when [metrics] listen is configured (served from run's start)
        self._applier: Applier | None = None
        self.metrics_address: tuple[str, int] | None = None
        self._reload = threading.Event()
        self._reloading: set[tuple[str, str]] = set()  # (target, table)s being loaded again now (_reload_marked)
        self._reloads: Backoffs[tuple[str, str]] = Backoffs()  # (target, table)s not to load again before their time
        self._reloads_lock = threading.Lock()

    @property
    def applying(self) -> bool:
        """Has the live loop started (the targets' first loads done)?"""
        return self._applier is not None

    def stop(self) -> None:
        self._stop.set()
        self.capture.stop()

    def request_reload(self) -> None:
        """Read the configuration file again at the next step (``run`` does on SIGHUP; signal-handler safe)."""
        self._reload.set()

    def _reload_config(self, applier: Applier) -> None:
        """The configuration file read again: targets added are loaded beside the others (or wait for files),
        targets removed are no longer applied; tables added or removed restart capture with them, then each target
        in turn pauses while it loads the added tables (the others go on) and catches up. Any other change is said
        to take effect at the next start. A file that does not load, or tables the source does not have as
        configured, are reported and the running configuration kept."""
        import dataclasses

        self._reload.clear()
        try:
            new = config_mod.load(self.config.file)
        except MirrorlineError as e:
            self.on_message(f"configuration not reloaded (run goes on as it was): {e}")
            return
        old = self.config
        later = [k for k in ("source", "log", "apply", "spark", "metrics") if getattr(new, k) != getattr(old, k)]
        later += [f"targets.{n}" for n in old.targets if n in new.targets and new.targets[n] != old.targets[n]]
        later += [f'tables."{t}"' for t in old.tables if t in new.tables and new.tables[t] != old.tables[t]]
        added = [n for n in new.targets if n not in old.targets]
        removed = [n for n in old.targets if n not in new.targets]
        kept = {n: t for n, t in old.targets.items() if n in new.targets}
        tables_added = [t for t in new.tables if t not in old.tables]
        tables_removed = [t for t in old.tables if t not in new.tables]
        tables = {t: old.tables.get(t, c) for t, c in new.tables.items()}  # a changed table keeps its settings
        targets = {**kept, **{n: new.targets[n] for n in added}}
        if (tables_added or tables_removed) and "source" not in later and "log" not in later:
            changed = dataclasses.replace(old, tables=tables, targets=targets)
            error = self._check_tables(changed)
            if error is None:
                error = self._restart_capture(changed)
                if error is not None:  # capture goes on with the tables it had
                    again = self._restart_capture(dataclasses.replace(old, targets=targets))
                    if again is not None:
                        raise again
            if error is not None:
                self.on_message(f"configuration not reloaded (run goes on as it was): {first_line(error)}")
                return
        elif tables_added or tables_removed:
            later.append("tables")
            tables_added = tables_removed = []
            tables = old.tables
        self.config = dataclasses.replace(old, tables=tables, targets=targets)
        applier.configure(self.config)
        announce_run(self.config.log.path, self.config.targets)
        for n in removed:
            applier.remove(n)
            self.on_message(
                f"target {n} removed from the configuration: no longer applied (the log keeps its changes until "
                f"`mirrorline target drop {n}`)"
            )
        wire = [n for n in added if self.config.targets[n].initial == "wire"]
        files = [n for n in added if n not in wire]
        if tables_added or tables_removed:
            what = [f"added {', '.join(tables_added)}"] if tables_added else []
            what += [f"removed {', '.join(tables_removed)}"] if tables_removed else []
            then = (
                "the targets pause, load the added tables one after the other, and each catches up once loaded"
                if tables_added
                else "no longer applied (left at the targets as they are)"
            )
            self.on_message(f"tables {'; '.join(what)}: captured from now on as configured; {then}")
            wire += [n for n in kept if n in applier.targets]  # (one waiting for files loads them all later)
        if wire:
            if added:
                self.on_message(
                    f"target(s) {', '.join(n for n in wire if n in added)} added: loaded beside the "
                    "others, then applied"
                )
            threading.Thread(
                target=self._load_beside,
                args=(wire, applier),
                kwargs={"pause": [n for n in wire if n in kept]},
                name="mirrorline-load",
                daemon=True,
            ).start()
        if files:
            self._keep_log_for(files)
            threading.Thread(
                target=self._watch_files, args=(files, applier), name="mirrorline-files", daemon=True
            ).start()
        if later:
            self.on_message(
                f"configuration reloaded; changed {', '.join(later)}: that takes effect when run starts again"
            )
        elif not added and not removed and not tables_added and not tables_removed:
            self.on_message("configuration reloaded: no change")

    def _known_bags(self) -> dict[str, tuple[str, ...]]:
        """The tables without a key the small units' plan is warmed up and built for: those the log knows, and
        those the source has that the log does not know yet (:func:`known_bags`)."""

        assert self.config.source is not None
        try:
            conn = connect(self.config.source.dsn)
        except Exception as e:  # (capture says so itself)
            log.debug("the source not asked for the tables without a key: %s", e)
            return known_bags(self.config)
        try:
            return known_bags(self.config, conn)
        finally:
            conn.close()

    def _check_tables(self, config: Config) -> BaseException | None:
        """The configured tables as the source has them now (each exists, is a table, has a key): the error, if
        not."""

        assert config.source is not None
        replicated: set[str] = set()
        if self.log.layout.exists():
            self.log.schemas.refresh()
            replicated = set(self.log.schemas.tables())
        try:
            conn = connect(config.source.dsn)
            try:
                describe_tables(conn, config, replicated=replicated)
            finally:
                conn.close()
        except Exception as e:
            return e
        return None

    def _tick(self, applier: Applier) -> None:
        """Before each step of the live loop: the configuration read again when asked (SIGHUP), and tables whose
        rows changed at the source with nothing logged loaded again."""
        if self._reload.is_set():
            self._reload_config(applier)
        if not self.once:
            self._reload_marked(applier)

    def _reload_marked(self, applier: Applier) -> None:
        """A table stopped at a target because its rows changed at the source with nothing logged (a partition
        attached with rows, detached, dropped or truncated alone: ``ResyncStop``) is loaded again at that target, in
        a thread of its own, while the target's other tables and the other targets go on (the pipeline does not try
        the table while its snapshot state is ``loading``; the load ends its hold). A load that fails is tried again
        after 2 s, doubling up to 60 s."""

        for (n, t), err in applier.held().items():
            if not isinstance(err, ResyncStop) or not self._reloads.due((n, t)):
                continue
            with self._reloads_lock:
                if (n, t) in self._reloading:
                    continue
                self._reloading.add((n, t))
            guard = applier.roster.table_lock((n, t))
            threading.Thread(
                target=self._reload_table, args=(n, t, guard), name="mirrorline-reload", daemon=True
            ).start()

    def _reload_table(self, name: str, table: str, guard: threading.Lock) -> None:

        try:
            get_spark().sparkContext.setLocalProperty("spark.scheduler.pool", "load")
            self.on_message(
                f"target {name}: loading table {table} again (its rows changed at the source with nothing logged)"
            )
            with guard:  # (a unit of the held table under way commits first; none starts until the load ends)
                r = snapshot_target(self.config, name, tables=[table])
            # (until the pipeline's next step sees the hold ended, it still lists the table as held)
            self._reloads.wait((name, table), 10.0, MirrorlineError(f"table {table} at target {name} just loaded"))
            self.on_message(
                f"target {name}: table {table} loaded again ({r.rows.get(table, 0)} rows), applied from {r.position}"
            )
        except Exception as e:
            delay = self._reloads.fail((name, table), e).delay
            self.on_message(
                f"target {name}: loading table {table} again failed: {first_line(e)} (tried again in {delay:.0f} s)"
            )
        finally:
            with self._reloads_lock:
                self._reloading.discard((name, table))

    def _capture_running(self) -> bool:
        """Is capture's thread streaming from the source (or retrying a lost connection)?"""
        t = self._capture_thread
        return t is not None and t.is_alive() and not self._capture_done.is_set()

    def _capture_main(self, capture: Any, done: threading.Event) -> None:
        try:
            stats = capture.run()
            self.result.captured += stats.changes
        except BaseException as e:  # handed to the main thread (which, restarting capture, takes it back)
            self._capture_error = e
            if not self._restarting:
                self._stop.set()
        finally:
            done.set()

    def _start_capture(self) -> None:
        done = self._capture_done = threading.Event()
        self._capture_thread = threading.Thread(
            target=self._capture_main, args=(self.capture, done), name="mirrorline-capture", daemon=True
        )
        self._capture_thread.start()

    def _stop_capture(self) -> None:
        self.capture.stop()
        if self._capture_thread is not None:
            self._capture_thread.join(timeout=30)

    def _restart_capture(self, config: Config) -> BaseException | None:
        """Capture stopped at a transaction's end and started again with ``config`` (its tables: the publication
        reconciled, their schemas recorded); the error when it does not get to streaming (then it is not running)."""
        from mirrorline.capture.session import Capture

        self._stop_capture()
        if self._capture_error is not None:
            return self._capture_error
        self._ready.clear()
        self._restarting = True
        try:
            self.capture = Capture(config, once=self.once, on_ready=lambda _stats: self._ready.set())
            self.capture.stream_watcher = self._ahead
            self._start_capture()
            while not (self._ready.wait(0.1) or self._capture_done.is_set()):
                pass
        finally:
            self._restarting = False
        if self._ready.is_set():
            return None
        e, self._capture_error = self._capture_error, None
        return e or MirrorlineError("capture ended before it streamed")

    def _stopped_now(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The targets and the (target, table)s stopped now, for the metrics (read from another thread)."""
        a = self._applier
        if a is None:
            return [], []
        return sorted(a.failed()), sorted(a.held())

    def _problems_now(self) -> tuple[dict[str, Exception], dict[tuple[str, str], Exception]]:
        """The targets and the (target, table)s stopped now, with their errors, for the status page."""
        a = self._applier
        if a is None:
            return {}, {}
        return dict(a.failed()), dict(a.held())

    def _unit(self, r: UnitReport) -> None:
        self.result.units += 1
        self.result.applied += r.changes
        for n in r.targets if r.table is None else ():  # (a held table's unit leaves the target's position)
            self._positions[n] = r.end
        if self.metrics is not None:
            self.metrics.unit(r)
        if self.on_unit:
            self.on_unit(r)

    def _reconcile(self, names: list[str] | None = None) -> None:
        """Once capture streams with the current configuration: load new targets and tables added to the
        configuration (DESIGN §7)."""

        for r in reconcile_targets(self.config, names):
            self.on_message(r.summary())

    def _load_beside(self, names: list[str], applier: Applier, pause: list[str] | None = None) -> None:
        """In a thread of its own: load each of ``names`` (its Spark jobs in a scheduler pool of their own) and add
        it to ``applier``, which meanwhile applies to the other targets. A load that fails stops that target alone
        (recorded for ``status``): it is loaded again after 2 s, the delay doubling up to 60 s, while the others go
        on. ``loaded`` is set once every target was tried once. ``pause``: these targets are taken out of ``applier``
        first (tables were added to the ones it applies to: none may apply their changes before loading them), each
        added again once loaded."""
        left: Backoffs[str] = Backoffs()  # the targets whose load failed, each tried again after its delay
        try:
            from mirrorline.sparkenv import get_spark

            get_spark().sparkContext.setLocalProperty("spark.scheduler.pool", "load")
            if pause and not self._paused(pause, applier):
                return
            for name in names:
                if self._stop.is_set():
                    return
                error = self._load_one(name, applier)
                if error is not None:
                    left.fail(name, error)
            self.loaded.set()
            while left and not self._stop.wait(left.next_in() or 0.0):
                for name in [n for n in left if left.due(n)]:
                    error = None if name not in self.config.targets else self._load_one(name, applier)
                    if error is None:  # (loaded, or removed meanwhile)
                        left.pop(name)
                    else:
                        left.fail(name, error)
        except BaseException as e:  # (not a load's failure: handed to the main thread, which stops)
            self._load_error = e
            self._stop.set()
        finally:
            self.loaded.set()

    def _paused(self, names: list[str], applier: Applier) -> bool:
        """Wait until the pipeline has taken ``names`` out (False: run stops meanwhile)."""
        events = [applier.pause(n) for n in names]
        for out in events:
            while not out.wait(0.1):
                if self._stop.is_set():
                    return False
        return True

    def _load_one(self, name: str, applier: Applier) -> Exception | None:
        """Load target ``name`` and add it to ``applier``; the error (recorded, said) when the load failed."""
        applier.loading(name)
        try:
            self._reconcile([name])
        except Exception as e:
            stopped.record(self.config.log.path, name, e, "")
            text = first_line(e)
            self.on_message(f"target {name}: loading failed: {text} (the other targets go on; it is tried again)")
            return e
        stopped.clear(self.config.log.path, name)
        applier.admit(name)
        return None

    def _removed_targets(self) -> None:

        cl = self.log
        if not cl.layout.exists():
            return
        for name, r in sorted(unconfigured(cl, self.config.targets).items()):
            if self.forget_removed:
                unregister(cl, name)
                stopped.clear(self.config.log.path, name)
                self.on_message(
                    f"target {name} (no longer configured) unregistered: the log no longer keeps its changes"
                )
            else:
                log.warning(
                    "target %s is no longer configured but holds the log at %s: run `mirrorline target drop %s` "
                    "(or start with --forget-removed) so that retention moves on",
                    name,
                    r.applied,
                    name,
                )

    def _start_targets(self, warm: WarmUp) -> Applier:
        """The pipeline for the targets ready to apply. A target that needs loading (new, or a table added) is
        loaded beside them and joins them once loaded; one loaded by files (``initial = "files"``) has the log
        kept for it and joins once ``snapshot load`` has loaded it. With ``once``, or when no target is ready,
        the loads happen first."""
        loading: list[str] = []
        if self._capture_error is None and not self._stop.is_set():
            loading = [n for n in sorted(self.config.targets) if needs_load(self.config, n)]
        waiting = [n for n in loading if self.config.targets[n].initial == "files"]
        loading = [n for n in loading if n not in waiting]

        reload = needs_reload(self.log)
        for n in sorted(reload):
            if n in self.config.targets:
                self.on_message(
                    f"target {n} needs a reload ({reload_reason(reload[n])}): mirrorline snapshot --target {n}"
                )
        ready = [n for n in self.config.targets if n not in loading and n not in waiting and n not in reload]
        if waiting:
            self._keep_log_for(waiting)
        if loading and (self.once or not ready):
            self._reconcile(loading)
            ready, loading = ready + loading, []
        if not ready and not waiting:
            n = sorted(reload)[0]
            raise MirrorlineError(
                f"every target needs a reload ({n}: {reload_reason(reload[n])})",
                hint=f"mirrorline snapshot --target {n}",
            )
        if not ready:
            raise MirrorlineError(
                f"every target waits for files ({', '.join(waiting)}): nothing to apply yet",
                hint="run `mirrorline snapshot export DIR`, carry the folder over, then `mirrorline snapshot load "
                "--target NAME DIR`, and start run again",
            )
        self._reconcile(ready)  # (tables removed from the configuration are marked)
        applier = Applier(self.config, ready, warm_up=warm, later=loading + waiting, bags=self._bags)
        applier.on_message = self.on_message
        if loading:
            loader = threading.Thread(
                target=self._load_beside, args=(loading, applier), name="mirrorline-load", daemon=True
            )
            loader.start()
        else:
            self.loaded.set()
        if waiting and not self.once:
            threading.Thread(
                target=self._watch_files, args=(waiting, applier), name="mirrorline-files", daemon=True
            ).start()
        return applier

    def _say_behind(self, applier: Applier) -> None:
        """One line per target at start: how far behind the log's end it is (changes and the age of the oldest)."""
        durable = applier.log.durable()
        for n, p in sorted(self._positions.items()):
            if durable is None or p >= durable:
                self.on_message(f"target {n}: applied up to {p}, nothing in the log beyond it")
                continue
            try:
                count, first = applier.log.count(p, durable), applier.log.first_ts_after(p)
            except MirrorlineError as e:
                self.on_message(f"target {n}: applied up to {p}; {e}")
                continue
            age = f", the oldest committed {time.time() - first / 1e6:.1f} s ago" if first is not None else ""
            self.on_message(f"target {n}: applied up to {p}, {count} change(s) behind the log's end{age}")

    def _keep_log_for(self, names: list[str]) -> None:
        """Register targets waiting for files with the log at its end now (an export taken later starts after it),
        so that retention keeps what they will need."""

        cl = self.log
        have = readers(cl)
        for n in names:
            if n not in have:
                set_applied(cl, n, cl.durable())
            self.on_message(f"target {n}: waiting for files (snapshot export, then snapshot load --target {n})")

    def _watch_files(self, names: list[str], applier: Applier, every: float = 1.0) -> None:
        """Admit each waiting target once ``snapshot load`` has loaded it (which registers it with the log at the
        folder's position: only then is the target itself opened, and once)."""

        cl = self.log
        seen = {n: r.updated for n, r in readers(cl).items() if n in names}
        left = list(names)
        while left and not self._stop.wait(every):
            try:
                now = readers(cl)
                for n in list(left):
                    r = now.get(n)
                    if r is not None and r.updated != seen.get(n):
                        if not needs_load(self.config, n):
                            left.remove(n)
                            self.on_message(f"target {n}: loaded from files; it catches up with the others")
                            applier.admit(n)
                        seen[n] = r.updated
            except MirrorlineError as e:  # the target unreachable a moment: looked at again at the next round
                log.warning("waiting for files: %s", e)

    def run(self) -> RunResult:
        self._removed_targets()
        applier: Applier | None = None
        if self.config.metrics.listen is not None:
            self.metrics = RunMetrics(
                self.config,
                lambda: dict(self._positions),
                lambda: self.capture.stats,
                self._stopped_now,
                self._capture_running,
                self._problems_now,
            )
            self.metrics_address = self.metrics.start()
        try:
            self._start_capture()
            # Spark warms up while capture connects and new targets load; the first unit waits for it
            from mirrorline.compile.compiler import warm_up
            from mirrorline.sparkenv import get_spark

            self._bags = self._known_bags()
            warm = warm_up(get_spark, self.config.actions, self._bags, on_ready=self.on_message)
            while not (self._ready.wait(0.1) or self._capture_done.is_set()):
                pass
            if self._ready.is_set():  # (capture holds the log now: target drop asks this file)
                announce_run(self.config.log.path, self.config.targets)
            applier = self._applier = self._start_targets(warm)
            applier.ahead = self._ahead
            self._ahead.start(applier)
            self._positions.update(applier.positions())
            self._say_behind(applier)
            applier.follow(
                self._stop,
                on_unit=self._unit,
                until=self._capture_done.is_set if self.once else None,
                tick=lambda: self._tick(applier),
            )
            if self.once and self._capture_error is None and not self._stop.is_set():
                for r in applier.catch_up():
                    self._unit(r)
            self.result.positions = applier.positions()
        except BaseException:
            if self.metrics is not None:
                self.metrics.errors.labels("apply").inc()
            raise
        finally:
            self._stop_capture()
            self._ahead.close()
            if applier is not None:
                applier.close()
            if self.metrics is not None:
                self.metrics.stop()
        if self._capture_error is not None:
            raise self._capture_error
        if self._load_error is not None:
            raise self._load_error
        return self.result
