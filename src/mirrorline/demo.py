"""``mirrorline demo``: the embedded default, end to end on this machine.

1. Starts a throwaway PostgreSQL (``wal_level=logical``, ``logical_decoding_work_mem=64kB`` so that large
   transactions are streamed) and fills three tables with a generated workload.
2. Writes a configuration with three targets, a SQLite file, a DuckDB file and a folder of Delta Lake tables, and
   starts ``mirrorline run``: capture, the initial snapshot of the three targets, then compile and apply,
   continuously.
3. Meanwhile runs more of the workload (inserts, updates, some changing the key or leaving a TOASTed value
   unchanged, deletes, a truncate, rolled-back transactions) and one large transaction that PostgreSQL streams.
4. Waits until every target has applied everything, stops, and prints what happened, ``status`` and ``verify``.

With ``serve`` (``demo --serve``), ``run`` also serves its status page and metrics, and the source keeps changing
until Ctrl-C; then 4.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from mirrorline import config as cfg
from mirrorline.apply import open_target
from mirrorline.log.reader import ChangeLog
from mirrorline.pgcluster import PgCluster, free_port
from mirrorline.pipeline import Runner, UnitReport
from mirrorline.workload import TABLES, Workload


def _say(msg: str) -> None:
    print(msg, flush=True)


def _config_text(dsn: str, folder: Path, listen: str | None = None) -> str:
    tables = "".join(f'[tables."{t}"]\n' for t in TABLES)
    metrics = f'[metrics]\nlisten = "{listen}"\n\n' if listen else ""
    return (
        metrics + f'[source]\ndsn = "{dsn}"\nslot = "mirrorline_demo"\n\n'
        f'[log]\npath = "{folder / "log"}"\n\n'
        '[apply]\nlatency = "500ms"\nmax_changes = 1000000\n\n'
        f"{tables}\n"
        f'[targets.cache]\nurl = "sqlite:///{folder / "cache.db"}"\n'
        f'[targets.lake]\nurl = "duckdb:///{folder / "lake.duckdb"}"\n'
        f'[targets.delta]\nurl = "delta:///{folder / "delta"}"\n'
    )


def run_demo(transactions: int = 2000, large: int = 100_000, keep: str | None = None, serve: str | None = None) -> int:
    """The demo (the module's docstring); ``serve``: the address (host:port) of the status page, kept up with the
    source changing until Ctrl-C."""
    if serve and serve.endswith(":0"):  # a free port
        serve = serve[:-1] + str(free_port())
    folder = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="mirrorline-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    _say("mirrorline demo: a throwaway PostgreSQL replicated into SQLite, DuckDB and Delta Lake tables")
    cluster = PgCluster({"logical_decoding_work_mem": "64kB"})
    try:
        cluster.start()
        _say(f"  PostgreSQL started on 127.0.0.1:{cluster.port}")
        work = Workload(cluster.dsn(), seed=2026)
        work.create()
        work.run(transactions=transactions // 2)
        _say(
            f"  workload: {len(work.accounts)} accounts, {len(work.events)} events, {len(work.ledger)} ledger "
            "rows before replication starts"
        )

        conf_file = folder / "mirrorline.toml"
        conf_file.write_text(_config_text(cluster.dsn(), folder, serve))
        config = cfg.load(conf_file)
        units: list[UnitReport] = []
        runner = Runner(config, on_unit=units.append, on_message=lambda m: _say(f"  {m}"))
        errors: list[BaseException] = []

        def pipeline() -> None:
            try:
                runner.run()
            except BaseException as e:
                errors.append(e)

        _say(f"  mirrorline run -c {conf_file}: capture, snapshot, compile on Spark, apply")
        thread = threading.Thread(target=pipeline, name="mirrorline-run", daemon=True)
        thread.start()
        while not runner.loaded.wait(0.2):
            if errors or not thread.is_alive():
                raise errors[0] if errors else RuntimeError("mirrorline run stopped before the targets were loaded")
        _say("  targets loaded; now changing the source while mirrorline runs")
        if serve:
            host, port = runner.metrics_address or ("?", 0)
            _say(f"  status page: http://{host}:{port}/ (metrics at /metrics); the source keeps changing: Ctrl-C stops")
            try:
                while not errors and thread.is_alive():
                    work.run(transactions=5)
                    time.sleep(0.5)
            except KeyboardInterrupt:
                _say("  stopping: the targets apply what is left")
        work.run(transactions=transactions // 2)
        work.large_transaction(large)
        done_lsn = work.mark()
        _say(
            f"  more workload while it runs, then one transaction of {2 * large} changes (streamed); "
            f"{work.statements} statements in all"
        )
        _wait_applied(config, done_lsn, thread, errors)
        runner.stop()
        thread.join(timeout=60)
        if errors:
            raise errors[0]
        changes = sum(u.changes for u in units)
        secs = sum(u.compile_seconds + max(u.apply_seconds.values(), default=0) for u in units)
        _say(f"  applied {changes} changes in {len(units)} units of work ({secs:.1f} s compiling and applying)")
        for u in [u for u in units if u.changes][-3:]:
            applied = ", ".join(f"{n} {s:.2f} s" for n, s in u.apply_seconds.items())
            rows = next(iter(u.results.values())).rows if u.results else {}
            net = sum(sum(k.values()) for k in rows.values())
            _say(
                f"    unit {u.start}..{u.end}: {u.changes} changes -> {net} net row changes, "
                f"compiled {u.compile_seconds:.2f} s, applied {applied}"
            )

        from mirrorline.status import status
        from mirrorline.verify import verify

        _say("")
        _say("$ mirrorline status")
        _say(status(config).text().rstrip())
        _say("")
        _say("$ mirrorline verify")
        report = verify(config)
        _say(report.text().rstrip())
        _say("")
        _say(
            f"demo {'passed' if report.ok else 'FOUND DIFFERENCES'} in {time.monotonic() - t_start:.0f} s; "
            f"files in {folder}" + ("" if keep else " (removed)")
        )
        return 0 if report.ok else 1
    finally:
        cluster.stop()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _wait_applied(
    config: cfg.Config, lsn: int, thread: threading.Thread, errors: list[BaseException], timeout: float = 900
) -> None:
    """Until the log holds the source's changes up to ``lsn`` and every target has applied the whole log."""
    log = ChangeLog(config.log.path)
    deadline = time.monotonic() + timeout
    targets = {n: open_target(t) for n, t in config.targets.items()}
    try:
        while time.monotonic() < deadline:
            if errors or not thread.is_alive():
                return
            durable = log.durable() if log.layout.exists() else None
            if (
                durable is not None
                and durable.lsn >= lsn
                and all(t.applied_positions().position >= durable for t in targets.values())
            ):
                return
            time.sleep(0.5)
        print("demo: the targets did not catch up in time", file=sys.stderr)
    finally:
        for t in targets.values():
            t.close()
