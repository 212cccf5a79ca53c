"""Exactly once when ``run`` is killed (SIGKILL) while it applies a streamed transaction ahead of its commit: before
the source commits (each target's open transaction is lost with the process: nothing of it is there), and at random
moments just after the commit (some targets may have committed it, others not). Restarted, every target equals the
source, read by the kind's own client."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import oracle
import psycopg2
import pytest
from pipeline_support import config_text, target_url
from waiting import wait_until

pytestmark = [pytest.mark.pg, pytest.mark.slow, pytest.mark.timeout(600)]

TABLE = "public.big one"
COLS = ["id", "n", "t"]
KINDS = ("sqlite", "duckdb", "postgresql")
# run, its streamed transactions cut every 500 rows (the test cluster streams past 64 kB)
RUN = "import sys; from mirrorline import limits; limits.AHEAD_ROWS = 500; from mirrorline.cli.main import main; main()"


def start(conf: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - handed to the child
    return subprocess.Popen([sys.executable, "-c", RUN, "-v", "run", *args, "-c", str(conf)], stdout=out, stderr=out)


def rows(kind: str, url: str) -> list[tuple[Any, ...]]:
    location = url.split(":///", 1)[1] if kind != "postgresql" else url
    return sorted(oracle.read(kind, location, TABLE, COLS) or [])


def source(dsn: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'SELECT {", ".join(COLS)} FROM public."big one" ORDER BY id')
            return list(cur.fetchall())
    finally:
        conn.close()


def big_transaction(conn: Any, round_: int) -> None:
    with conn.cursor() as cur:
        cur.execute(f"UPDATE public.\"big one\" SET n = n + {round_}, t = t || '{round_}'")
        cur.execute(f'DELETE FROM public."big one" WHERE id % 11 = {round_}')
        cur.execute(
            f"INSERT INTO public.\"big one\" SELECT g, {round_}, 'r{round_}' "
            f"FROM generate_series({10_000 * round_}, {10_000 * round_ + 1500}) g"
        )


def test_run_killed_while_it_applies_ahead_of_the_commit(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    pg.execute(
        'CREATE TABLE public."big one" (id bigint PRIMARY KEY, n int, t text);'
        'INSERT INTO public."big one" SELECT g, g, md5(g::text) FROM generate_series(1, 3000) g'
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"ahead_{k}_{pg.name[-6:]}") for k in KINDS}
    conf = tmp_path / "m.toml"
    conf.write_text(
        config_text(pg.dsn, tmp_path / "log", {k: (u, "update") for k, u in urls.items()}, tables={TABLE: {}})
    )
    log = tmp_path / "run.log"
    rng = random.Random(5)
    conn = psycopg2.connect(pg.dsn)

    def ahead_started(times: int) -> bool:
        # (every target had applied the log up to the transaction's start: DuckDB, which run holds, too)
        return log.read_text().count("applying it ahead of its commit at duckdb, postgresql, sqlite") >= times

    def differences(want: list[tuple[Any, ...]]) -> str:
        out = []
        for k, u in urls.items():
            if k != "duckdb":
                have = set(rows(k, u))
                out.append(f"{k}: missing {sorted(set(want) - have)[:5]}, extra {sorted(have - set(want))[:5]}")
        return "\n".join(out)

    def tail() -> str:
        return log.read_text()[-3000:]

    def at_source() -> list[tuple[Any, ...]]:
        """The source's rows, once every target but DuckDB (which run holds open) has them."""
        want = source(pg.dsn)
        wait_until(
            lambda: all(rows(k, u) == want for k, u in urls.items() if k != "duckdb"),
            timeout=180,
            what="run has every target at the source",
            context=lambda: f"{differences(want)}\n{tail()}",
        )
        return want

    try:
        for round_ in range(1, 5):
            proc = start(conf, log)
            try:
                # a change in the log before the transaction, so that its start is known: committed once run has
                # every target at the source (in the first round, a change committed before run made its slot is in
                # the targets' snapshots, not in the log), and applied before the transaction begins
                at_source()
                with conn.cursor() as cur:
                    cur.execute('INSERT INTO public."big one" VALUES (%s, 0, NULL)', (-round_,))
                conn.commit()
                before = at_source()
                big_transaction(conn, round_)
                wait_until(
                    lambda r=round_: ahead_started(r), timeout=60, what="the transaction is applied ahead", context=tail
                )
                time.sleep(rng.uniform(0.2, 1.5))
                if round_ % 2:  # killed before the source commits: nothing of it is at any target
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(30)
                    assert {k: rows(k, u) for k, u in urls.items()} == {k: before for k in urls}
                    conn.commit()
                else:  # killed while the targets commit it, or just before, or after
                    conn.commit()
                    time.sleep(rng.uniform(0.0, 2.0))
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        final = start(conf, log, "--once")
        assert final.wait(300) == 0, tail()
    finally:
        conn.close()
    want = source(pg.dsn)
    for k, u in urls.items():
        assert rows(k, u) == want, k
