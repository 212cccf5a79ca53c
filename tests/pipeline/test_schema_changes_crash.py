"""SIGKILL between a schema change on the source and the first unit after it: ``mirrorline run`` is killed
while a target's schema change is open (its DDL not committed) and right after it committed (the unit after it not
yet applied), for each kind of change, while another table keeps changing; every restart continues, and at the end
every target of each SQL kind equals the source (read back through its own client) and ``verify`` says so."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from crash_support import finish, mirrorline_process
from pipeline_support import target_url

from mirrorline import config as cfg
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.timeout(600)]

CHANGES = [
    "ALTER TABLE public.sc ADD COLUMN e integer DEFAULT 7",
    "ALTER TABLE public.sc RENAME COLUMN a TO a2",
    "ALTER TABLE public.sc ALTER COLUMN a2 TYPE bigint",
    "ALTER TABLE public.sc DROP COLUMN d",
    "ALTER TABLE public.sc DROP CONSTRAINT sc_pkey, ADD PRIMARY KEY (id, b)",
]


def test_run_killed_around_schema_changes(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    pg.execute(
        "CREATE TABLE public.sc (id integer PRIMARY KEY, a integer, b text NOT NULL, d text);"
        "CREATE TABLE public.other (id integer PRIMARY KEY, v text);"
        "INSERT INTO public.sc SELECT i, i, 'b' || i, 'd' || i FROM generate_series(1, 200) i;"
        "INSERT INTO public.other SELECT i, 'v' FROM generate_series(1, 50) i"
    )
    kinds = {"lite": "sqlite", "duck": "duckdb", "pgt": "postgresql"}
    urls = {n: target_url(k, tmp_path, pg_cluster, f"scc_{n}_{pg.name[-6:]}") for n, k in kinds.items()}
    conf_file = configs.write(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables=["public.sc", "public.other"],
        targets=urls,
    )
    args = ["run", "-vv", "-c", str(conf_file)]
    log_file = tmp_path / "child.log"
    landed: list[str] = []
    n = 0

    def load() -> str:
        nonlocal n
        n += 1
        return (
            f"UPDATE public.other SET v = v || '{n}' WHERE id = {n % 50 + 1};"
            f"UPDATE public.sc SET b = b || '+' WHERE id = {n % 200 + 1};"
        )

    finish(["run", "--once", "-c", str(conf_file)], tmp_path)  # every target loaded before the first change
    for i, ddl in enumerate(CHANGES):
        # before the change and after it, in one transaction; then more changes in later ones
        pg.execute(f"BEGIN; {load()} {ddl}; {load()} COMMIT")
        pg.execute(load())
        aim = "schema change open" if i % 2 == 0 else "schema change committed"
        start = log_file.stat().st_size if log_file.exists() else 0
        proc = mirrorline_process(*args, log_file=log_file)
        deadline = time.monotonic() + 120
        seen = False
        while proc.poll() is None and time.monotonic() < deadline:
            with open(log_file, "rb") as f:
                f.seek(start)
                text = f.read().decode(errors="replace")
            seen = any(aim in line and "target " in line for line in text.splitlines())
            if seen:
                break
            time.sleep(0.002)
        assert proc.poll() is None, f"run ended before the kill: {text[-2000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if seen:
            landed.append(aim)
        pg.execute(load())
    print("kills landed:", landed)
    assert landed.count("schema change open") >= 2 and landed.count("schema change committed") >= 2, landed

    finish(["run", "--once", "-c", str(conf_file)], tmp_path)
    for n_, url in urls.items():
        for table in ("public.sc", "public.other"):
            oracle.assert_same(pg.dsn, kinds[n_], url, table)
    report = verify(cfg.load(conf_file))
    assert report.ok, report.text()
