"""``run``'s metrics over HTTP, the way Prometheus scrapes exporters (``[metrics] listen``), through
``prometheus_client``: per target its lag in seconds and bytes (from its applied position and the change log, computed
at each scrape), whether it is stopped, and whether each table is stopped alone at it; units (compile and apply
durations as histograms), changes and rows applied, rejects, apply errors; whether capture runs, its changes and
reconnects; the slot's retained WAL on the source. ``status --prometheus`` gives the figures of a single look,
without a running process."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mirrorline.config import Config
from mirrorline.errors import ConfigError
from mirrorline.log.reader import ChangeLog
from mirrorline.position import Position

log = logging.getLogger("mirrorline.metrics")

_SLOT_SQL = "SELECT pg_current_wal_lsn() - restart_lsn FROM pg_replication_slots WHERE slot_name = %s"
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def loopback(host: str) -> bool:
    """Is ``host`` reachable from this machine only?"""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Live(Collector):
    """What is computed at each scrape: lag per target, capture's counters, the slot's retained WAL."""

    def __init__(self, metrics: RunMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m = self.m
        lag_s = GaugeMetricFamily(
            "mirrorline_target_lag_seconds", "Age of the oldest change the target has not applied.", labels=["target"]
        )
        lag_b = GaugeMetricFamily(
            "mirrorline_target_lag_bytes",
            "WAL between the target's applied position and the log's end.",
            labels=["target"],
        )
        for name, (secs, nbytes) in sorted(m.lags().items()):
            lag_s.add_metric([name], secs)
            lag_b.add_metric([name], nbytes)
        yield lag_s
        yield lag_b
        targets, tables = m.stopped()
        g = GaugeMetricFamily(
            "mirrorline_target_stopped", "1 for a target stopped by an error (tried again), else 0.", labels=["target"]
        )
        for name in sorted(m.config.targets):
            g.add_metric([name], 1 if name in targets else 0)
        yield g
        g = GaugeMetricFamily(
            "mirrorline_table_stopped",
            "1 for a table stopped alone at the target (its other tables go on), else 0.",
            labels=["target", "table"],
        )
        for name in sorted(m.config.targets):
            for table in sorted(m.config.tables):
                g.add_metric([name, table], 1 if (name, table) in tables else 0)
        yield g
        running = m.capture_running()
        if running is not None:
            g = GaugeMetricFamily(
                "mirrorline_capture_running", "1 while this run's capture streams from the source (or retries), else 0."
            )
            g.add_metric([], 1 if running else 0)
            yield g
        cap = m.capture_stats()
        if cap is not None:
            for name, help_text, value in (
                ("mirrorline_capture_changes", "Changes capture has written to the log.", cap.changes),
                ("mirrorline_capture_reconnects", "Times capture reconnected to the source.", cap.reconnects),
            ):
                g = GaugeMetricFamily(name, help_text)
                g.add_metric([], value)
                yield g
        retained = m.slot_retained()
        if retained is not None:
            g = GaugeMetricFamily(
                "mirrorline_slot_retained_wal_bytes", "WAL the slot keeps on the source.", labels=["slot"]
            )
            g.add_metric([m.config.source.slot if m.config.source else ""], retained)
            yield g


class RunMetrics:
    """The metrics of one ``run``, served at ``config.metrics.listen`` from :meth:`start`."""

    def __init__(
        self,
        config: Config,
        positions: Callable[[], dict[str, Position]],
        capture_stats: Callable[[], Any],
        stopped: Callable[[], tuple[list[str], list[tuple[str, str]]]] = lambda: ([], []),
        capture_running: Callable[[], bool | None] = lambda: None,
        problems: Callable[[], tuple[dict[str, Exception], dict[tuple[str, str], Exception]]] | None = None,
    ):
        self.config = config
        self.capture_running = capture_running  # None: no capture in this process
        # the targets and the (target, table)s stopped now, with their errors (the status page's reasons)
        self.problems = problems or (lambda: ({}, {}))
        self.positions = positions
        self.stopped = stopped  # the targets, and the (target, table)s, stopped by an error now
        self.capture_stats = capture_stats
        self.registry = CollectorRegistry()
        r = self.registry
        self.compile = Histogram(
            "mirrorline_unit_compile_seconds", "Seconds to compile a unit on Spark.", buckets=_BUCKETS, registry=r
        )
        self.apply = Histogram(
            "mirrorline_unit_apply_seconds",
            "Seconds to apply a unit to a target.",
            ["target"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.changes = Counter(
            "mirrorline_changes_applied", "Changes applied (log changes of the units).", ["target"], registry=r
        )
        self.rows = Counter(
            "mirrorline_rows_applied", "Net rows applied, by kind (D, U, I).", ["target", "kind"], registry=r
        )
        self.rejects = Counter("mirrorline_rejects", "Changes set aside in the rejects table.", ["target"], registry=r)
        self.errors = Counter("mirrorline_errors", "Errors that stopped replication.", ["stage"], registry=r)
        self.units = Counter("mirrorline_units", "Units of work applied.", ["target"], registry=r)
        r.register(_Live(self))
        self._slot: tuple[float, int | None] = (0.0, None)
        self._lock = threading.Lock()
        self.server: Any = None
        # the status page's memory: lag per target every sample_seconds over the last hour, the totals the rates
        # come from, and since when each table has been stopped
        self.history: deque[tuple[float, dict[str, float]]] = deque(maxlen=int(3600 / self.sample_seconds) + 1)
        self._totals: deque[tuple[float, int, int]] = deque(maxlen=64)  # (time, units, changes)
        self._units_total = self._changes_total = 0
        self._since: dict[tuple[str, str], float] = {}
        self._log_bytes: int | None = None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    sample_seconds = 10.0  # how often the status page's chart takes a point

    def lags(self) -> dict[str, tuple[float, int]]:
        """Each target's lag: the age of the oldest change it has not applied (seconds) and the WAL between its
        position and the log's end (bytes). Empty when the log cannot be read this moment."""
        out: dict[str, tuple[float, int]] = {}
        cl = ChangeLog(self.config.log.path)
        try:
            durable = cl.durable()
            for name, pos in sorted(self.positions().items()):
                first = cl.first_ts_after(pos) if durable is not None and pos < durable else None
                secs = max(0.0, time.time() - first / 1e6) if first is not None else 0.0
                out[name] = (secs, max(0, durable.lsn - pos.lsn) if durable is not None else 0)
        except Exception as e:  # a scrape never fails because the log is being rewritten under it
            log.debug("metrics: lag not computed: %s", e)
        return out

    def sample(self) -> None:
        """One point of the status page's chart and rates."""
        now = time.time()
        lags = self.lags()
        with self._lock:
            self.history.append((now, {n: v[0] for n, v in lags.items()}))
            self._totals.append((now, self._units_total, self._changes_total))
        try:
            from mirrorline.log.retention import tree_size

            self._log_bytes = tree_size(self.config.log.path)
        except OSError:
            self._log_bytes = None

    def _sampling(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as e:  # the page goes on without this point
                log.debug("metrics: no sample: %s", e)
            self._stop.wait(self.sample_seconds)

    def page(self) -> Any:
        """The status page's figures (:class:`mirrorline.statuspage.Page`)."""
        from mirrorline.statuspage import Page, StoppedTable, TargetRow

        now = time.time()
        failed, held = self.problems()
        positions = self.positions()
        lags = self.lags()
        rows = []
        for name in sorted(self.config.targets):
            secs, nbytes = lags.get(name, (None, None))
            if name in failed:
                state = "stopped"
            elif name not in positions:
                state = "loading"
            else:
                state = "live" if (secs or 0) <= 60 else "catching up"
            pos = positions.get(name)
            rows.append(TargetRow(name, state, str(pos) if pos else "", secs, nbytes, _error_text(failed.get(name))))
        with self._lock:
            for key in list(self._since):
                if key not in held:
                    del self._since[key]
            stopped = []
            for (target, table), err in sorted(held.items()):
                since = self._since.setdefault((target, table), now)
                stopped.append(StoppedTable(target, table, _error_text(err), since, _remedy(err, target, table)))
            history = list(self.history)
            totals = list(self._totals)
        units = changes = None
        if len(totals) >= 2:
            recent = [t for t in totals if t[0] >= totals[-1][0] - 60] or totals[-2:]
            first, last = (recent[0], recent[-1]) if len(recent) >= 2 else (totals[-2], totals[-1])
            span = max(last[0] - first[0], 1e-6)
            units, changes = (last[1] - first[1]) / span, (last[2] - first[2]) / span
        return Page(
            now=now,
            targets=rows,
            stopped=stopped,
            history=history,
            log_bytes=self._log_bytes,
            slot=self.config.source.slot if self.config.source else "",
            slot_retained_bytes=self.slot_retained(),
            units_per_second=units,
            changes_per_second=changes,
            capture_running=self.capture_running(),
        )

    def start(self) -> tuple[str, int]:
        """Serve the metrics; returns the address (host, port) bound."""
        assert self.config.metrics.listen is not None
        host, port = self.config.metrics.listen
        try:
            self.server = _serve(self, host, port)
        except OSError as e:  # the port taken, an address not of this machine
            raise ConfigError(
                str(self.config.file),
                "metrics.listen",
                f"cannot serve metrics at {host}:{port}: {e.strerror or e}",
                hint="choose a free port (or an address of this machine), or leave listen out",
            ) from None
        bound = self.server.server_address[:2]
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sampling, name="mirrorline-status-page", daemon=True)
        self._sampler.start()
        log.info("status page at http://%s:%d/, metrics at /metrics", bound[0], bound[1])
        if not loopback(host):
            log.warning(
                "metrics served at %s:%d to every host that reaches it, without authentication (table names, "
                "positions, lag): bind 127.0.0.1, or put a proxy or a firewall in front",
                host,
                bound[1],
            )
        return str(bound[0]), int(bound[1])

    def stop(self) -> None:
        self._stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def unit(self, report: Any) -> None:
        """One unit applied (a :class:`mirrorline.pipeline.UnitReport`)."""
        with self._lock:
            self._units_total += 1
            self._changes_total += report.changes
        if report.compiled:
            self.compile.observe(report.compile_seconds)
        for name in report.targets:
            self.units.labels(name).inc()
            self.changes.labels(name).inc(report.changes)
            if name in report.apply_seconds:
                self.apply.labels(name).observe(report.apply_seconds[name])
            res = report.results.get(name)
            if res is not None:
                self.rejects.labels(name).inc(res.rejects)
                for counts in res.rows.values():
                    for kind, n in counts.items():
                        self.rows.labels(name, kind).inc(n)

    def slot_retained(self, every: float = 10.0) -> int | None:
        """The slot's retained WAL, asked of the source at most every ``every`` seconds (None: not reachable)."""
        with self._lock:
            at, value = self._slot
            if time.monotonic() - at < every:
                return value
            value = None
            if self.config.source is not None:
                try:
                    import psycopg2

                    conn = psycopg2.connect(self.config.source.dsn, connect_timeout=2)
                    try:
                        with conn.cursor() as cur:
                            cur.execute(_SLOT_SQL, (self.config.source.slot,))
                            row = cur.fetchone()
                            value = int(row[0]) if row and row[0] is not None else None
                    finally:
                        conn.close()
                except Exception as e:
                    log.debug("metrics: slot not read: %s", e)
            self._slot = (time.monotonic(), value)
            return value


def _error_text(err: BaseException | None) -> str:
    """An error's message, without its hint (the page shows that as what ends it)."""
    if err is None:
        return ""
    text = str(getattr(err, "message", "") or err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _remedy(err: BaseException, target: str, table: str) -> str:
    """What ends a table's stop: its error's hint, else a retry (run's own) or a reload of the table."""
    hint = getattr(err, "hint", None)
    if hint:
        return str(hint)
    return f"run tries it again by itself; to load it anew: mirrorline snapshot --target {target} --table {table}"


def _serve(metrics: RunMetrics, host: str, port: int) -> ThreadingHTTPServer:
    """The status page at ``/`` and the metrics at ``/metrics``, each request in a thread of its own."""
    from mirrorline.statuspage import render

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/metrics":
                    body, ctype = generate_latest(metrics.registry), CONTENT_TYPE_LATEST
                elif path in ("/", "/index.html"):
                    body, ctype = render(metrics.page()).encode(), "text/html; charset=utf-8"
                else:
                    self.send_error(404, "the status page is at /, the metrics at /metrics")
                    return
            except Exception as e:  # said, and the server goes on
                log.warning("status page: %s failed: %s: %s", path, type(e).__name__, e)
                self.send_error(500, f"{type(e).__name__}: {e}")
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("status page: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="mirrorline-metrics", daemon=True).start()
    return server
