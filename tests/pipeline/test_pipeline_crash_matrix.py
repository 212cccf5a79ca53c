"""The crash matrix widened: ``run`` with ``threads = 2`` into a SQLite, a DuckDB (mirror mode) and a
PostgreSQL target with ``on_error = "reject"`` (rows planted there make some inserts fail), ``public.ledger``
replicated with ``actions = "IU"``, and new targets added while the kills go on. SIGKILLs are aimed at stages
(inside a target transaction, during a snapshot load, during capture's start-up) and at random moments, and the
stage each kill landed in is read from the child's debug log and recorded. Afterwards every target equals the source;
``public.ledger`` (deletes not applied) and the reject target equal control targets that applied the same log once,
without a kill, and the reject target holds each reject once."""

from __future__ import annotations

import random
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from crash_support import SourceLoad, finish, mirrorline_process
from pipeline_support import config_text, target_rows, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.snapshot import Options, snapshot_target
from mirrorline.workload import EVENTS, TABLES, Workload, source_rows

# its own time limit, about three times what each test takes on 2 cores (the suite's is 900 s)
pytestmark = [pytest.mark.pg, pytest.mark.slow, pytest.mark.timeout(600)]

PLANTED = [40, 90, 160, 250, 400]  # account ids planted at the reject targets: their inserts fail there
AIMS = ["startup"] * 3 + ["transaction"] * 6 + ["snapshot"] * 3 + ["random"] * 4
OPEN_RE = re.compile(r"target (\S+): (transaction|snapshot load) (open|committed|rolled back)")


def stages(text: str) -> set[str]:
    """The stages open at the end of a run's debug log: ``startup`` (capture started, not yet streaming),
    ``transaction`` (a target transaction of a unit), ``snapshot`` (a snapshot load's transaction)."""
    open_: Counter[str] = Counter()
    startup = False
    for line in text.splitlines():
        if "capture: starting up" in line:
            startup = True
        elif "capture: streaming from slot" in line:
            startup = False
        elif m := OPEN_RE.search(line):
            what = "transaction" if m.group(2) == "transaction" else "snapshot"
            open_[what] += 1 if m.group(3) == "open" else -1
    return {s for s, n in open_.items() if n > 0} | ({"startup"} if startup else set())


def aimed_kills(args: list[str], log_file: Path, rng: random.Random, before: Any) -> list[tuple[str, frozenset[str]]]:
    """For each aim (in a random order), start ``mirrorline ARGS -vv`` and SIGKILL it once the aimed stage is open
    (``random``: at a random moment); return (aim, the stages open when it was killed) per kill that landed."""
    out = []
    aims = list(AIMS)
    rng.shuffle(aims)
    for aim in aims:
        for _ in range(4):  # a stage can close before it is seen: try again
            before(aim)
            start = log_file.stat().st_size if log_file.exists() else 0
            proc = mirrorline_process(*args, log_file=log_file)
            deadline = time.monotonic() + (rng.uniform(0.5, 8.0) if aim == "random" else 120)
            seen: set[str] = set()
            while proc.poll() is None and time.monotonic() < deadline:
                with open(log_file, "rb") as f:
                    f.seek(start)
                    seen = stages(f.read().decode(errors="replace"))
                if aim in seen:
                    break
                time.sleep(0.002)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            if proc.returncode == -signal.SIGKILL and (aim == "random" or aim in seen):
                out.append((aim, frozenset(seen)))
                break
    return out


def _rows(kind: str, url: str, table: str) -> list[tuple[Any, ...]]:
    return target_rows(kind, url, table)


def _rejects(url: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute('SELECT lsn, seq, "table", "key", op FROM mirrorline_rejects ORDER BY lsn, seq')
            return cur.fetchall()
    finally:
        conn.close()


def test_run_killed_in_each_stage_with_threads_rejects_and_actions(pg, pg_cluster, tmp_path):
    work = Workload(pg.dsn, seed=9)
    work.create()
    urls = {
        "lite": target_url("sqlite", tmp_path, pg_cluster, "lite"),
        "duck": target_url("duckdb", tmp_path, pg_cluster, "duck"),
        "pgt": target_url("postgresql", tmp_path, pg_cluster, f"matrix_pgt_{pg.name[-6:]}"),
    }
    control = {
        "c_lite": target_url("sqlite", tmp_path, pg_cluster, "c_lite"),
        "c_pgt": target_url("postgresql", tmp_path, pg_cluster, f"matrix_cpgt_{pg.name[-6:]}"),
    }
    modes = {"lite": "update", "duck": "mirror", "pgt": "update", "c_lite": "update", "c_pgt": "update"}
    late: dict[str, str] = {}

    def write(path: Path, targets: dict[str, str]) -> cfg.Config:
        text = config_text(
            pg.dsn,
            tmp_path / "log",
            {
                n: {"url": u, "mode": modes.get(n, "update"), **({"on_error": "reject"} if n.endswith("pgt") else {})}
                for n, u in targets.items()
            },
            max_changes=200,
            latency="300ms",
            threads=2,
            tables={t: {"actions": "IU"} if t == "public.ledger" else {} for t in TABLES},
        )
        path.write_text(text)
        return cfg.load(path)

    run_file, control_file = tmp_path / "run.toml", tmp_path / "control.toml"
    run_conf, control_conf = write(run_file, urls), write(control_file, control)
    Capture(run_conf, once=True).run()  # slot and publication before the workload
    for conf, names in ((run_conf, urls), (control_conf, control)):
        for name in names:  # the tables are empty: every target starts at the same state
            snapshot_target(conf, name, options=Options(progress=False))
    for url in (urls["pgt"], control["c_pgt"]):
        conn = psycopg2.connect(url)
        with conn, conn.cursor() as cur:
            for i in PLANTED:
                cur.execute("INSERT INTO accounts VALUES (%s, 'planted', 0, true, '2020-01-01', NULL)", (i,))
        conn.close()

    work.every_kind()

    def before(aim: str) -> None:
        if aim == "snapshot":  # a new target: the next run loads it beside the others
            name = f"late{len(late)}"
            kind = "sqlite" if len(late) % 2 == 0 else "duckdb"
            late[name] = kind
            write(run_file, {**urls, **{n: target_url(k, tmp_path, pg_cluster, n) for n, k in late.items()}})

    load = SourceLoad(work, pause=0.2).start()
    try:
        kills = aimed_kills(["run", "-vv", "-c", str(run_file)], tmp_path / "child.log", random.Random(19), before)
    finally:
        load.stop()
    work.large_transaction(500)
    work.large_transaction(400, abort=True)
    print("kills (aim, stages open):", [(a, sorted(s)) for a, s in kills])
    landed = Counter(s for _, open_ in kills for s in open_)
    assert len(kills) >= len(AIMS) - 2, kills
    assert landed["transaction"] >= 3 and landed["snapshot"] >= 1 and landed["startup"] >= 1, landed
    assert all(work.counts[e] >= 1 for e in EVENTS), f"every kind of event happened: {dict(work.counts)}"

    text = run_file.read_text().replace("max_changes = 200\n", "max_changes = 5000\n")
    run_file.write_text(text)
    finish(["run", "--once", "-c", str(run_file)], tmp_path)
    finish(["apply", "--once", "-c", str(control_file)], tmp_path)

    late_urls = {n: target_url(k, tmp_path, pg_cluster, n) for n, k in late.items()}
    kinds = {"lite": "sqlite", "duck": "duckdb", "c_lite": "sqlite", **late}
    for table in ("public.accounts", "public.events"):
        src = source_rows(pg.dsn, table)
        for name, url in {"lite": urls["lite"], "duck": urls["duck"], **late_urls}.items():
            assert _rows(kinds[name], url, table) == src, f"{name}: {table} differs from the source"
    ledger = _rows("sqlite", control["c_lite"], "public.ledger")
    assert len(ledger) > len(source_rows(pg.dsn, "public.ledger")), "deletes were not applied (actions IU)"
    for name in ("lite", "duck"):
        assert _rows(kinds[name], urls[name], "public.ledger") == ledger, f"{name}: ledger differs from control"
    for table in ("public.accounts", "public.events", "public.ledger"):
        assert _rows("postgresql", urls["pgt"], table) == _rows("postgresql", control["c_pgt"], table), table
    rejects = _rejects(urls["pgt"])
    assert rejects and rejects == _rejects(control["c_pgt"]), "the same changes rejected, each once"
    assert len(set(rejects)) == len(rejects)
