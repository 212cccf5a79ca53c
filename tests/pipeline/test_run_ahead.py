"""``run`` applies a streamed transaction ahead of its commit (pipeline/ahead.py): its parts reach every target
while the source's transaction is still open, nothing of it is visible there before the source commits, and the
targets equal the source after the commit, the abort of the transaction or of a subtransaction, and a transaction
committed in between. Each target is read by the kind's own client (tests/support/oracle.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import oracle
import psycopg2
import pytest
from snapshot_support import RunnerThread, target_urls, write_config
from waiting import wait_until

from mirrorline import limits
from mirrorline.pipeline import Runner
from mirrorline.snapshot import Options, reconcile_targets

pytestmark = [pytest.mark.pg, pytest.mark.spark]

ROWS = 3_000
COLS = ["id", "n", "t"]


def _location(url: str) -> str:
    return url.split(":///", 1)[1] if url.startswith(("sqlite:", "duckdb:")) else url


def source_rows(dsn: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute('SELECT id, n, t FROM public."big one" ORDER BY id')
            return list(cur.fetchall())
    finally:
        conn.close()


def target_rows(kind: str, url: str) -> list[tuple[Any, ...]]:
    return sorted(oracle.read(kind, _location(url), "public.big one", COLS) or [])


@pytest.fixture
def running(pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(limits, "AHEAD_ROWS", 500)  # the test cluster streams past 64 kB: many small blocks
    pg.execute(
        'CREATE TABLE public."big one" (id bigint PRIMARY KEY, n int, t text);'
        f"""INSERT INTO public."big one" SELECT g, g, md5(g::text) FROM generate_series(1, {ROWS}) g"""
    )
    urls = target_urls(tmp_path, pg.cluster, ["postgresql", "sqlite", "duckdb"], target_dbs)
    config = write_config(tmp_path, pg.dsn, urls, {"public.big one": {}})
    reconcile_targets(config, options=Options(progress=False))
    runner = Runner(config)
    thread = RunnerThread(runner)
    thread.start()
    conn = psycopg2.connect(pg.dsn)

    def same() -> bool:
        assert not thread.errors, thread.errors
        want = source_rows(pg.dsn)
        return all(target_rows(k, u) == want for k, u in urls.items())

    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO public.\"big one\" VALUES (0, 0, 'start')")
        conn.commit()
        wait_until(same, timeout=120, what="every target has the first change")
        yield runner, conn, urls, same
    finally:
        conn.close()
        runner.stop()
        thread.join(60)
    assert not thread.errors, thread.errors


def _wait_parts(runner: Any, n: int) -> None:
    wait_until(lambda: runner._ahead.parts >= n, timeout=60, what=f"{n} parts are applied ahead")


def test_a_big_transaction_is_applied_while_open_and_shown_at_its_commit(running: Any) -> None:
    runner, conn, urls, same = running
    before = {k: target_rows(k, u) for k, u in urls.items()}
    with conn.cursor() as cur:
        cur.execute("UPDATE public.\"big one\" SET n = n + 1, t = t || 'x'")  # every row: nothing folds
        cur.execute(f"INSERT INTO public.\"big one\" SELECT g, g, 'new' FROM generate_series({ROWS + 1}, {ROWS * 2}) g")
        cur.execute('UPDATE public."big one" SET n = -n WHERE id % 3 = 0')  # keys changed twice: parts fold
        cur.execute('DELETE FROM public."big one" WHERE id % 7 = 0')
        cur.execute("INSERT INTO public.\"big one\" SELECT g, 1, 'tail' FROM generate_series(-40, -1) g")
    _wait_parts(runner, 4)
    assert {k: target_rows(k, u) for k, u in urls.items()} == before  # applied, not committed
    conn.commit()
    wait_until(same, timeout=120, what="every target equals the source after the commit")
    wait_until(lambda: runner._ahead.finished == 1, timeout=10, what="the transaction is counted as committed ahead")
    assert runner._ahead.abandoned == 0


def test_an_aborted_transaction_applied_ahead_leaves_nothing(running: Any) -> None:
    runner, conn, _urls, same = running
    with conn.cursor() as cur:
        cur.execute("UPDATE public.\"big one\" SET t = 'gone'")
        cur.execute('DELETE FROM public."big one" WHERE id > 10')
    _wait_parts(runner, 2)
    conn.rollback()
    wait_until(lambda: runner._ahead.abandoned >= 1, timeout=60, what="the transaction is given up")
    with conn.cursor() as cur:
        cur.execute("UPDATE public.\"big one\" SET t = 'after' WHERE id = 5")
    conn.commit()
    wait_until(same, timeout=120, what="every target equals the source after the abort")
    assert runner._ahead.finished == 0


def test_a_subtransaction_aborted_after_its_rows_were_applied(running: Any) -> None:
    runner, conn, _urls, same = running
    with conn.cursor() as cur:
        cur.execute('UPDATE public."big one" SET n = 7 WHERE id <= 1000')
        cur.execute("SAVEPOINT s1")
        cur.execute("UPDATE public.\"big one\" SET t = 'rolled back'")
        _wait_parts(runner, 3)
        cur.execute("ROLLBACK TO SAVEPOINT s1")
        cur.execute('DELETE FROM public."big one" WHERE id > 2000')
    conn.commit()
    wait_until(same, timeout=120, what="every target equals the source")
    assert (runner._ahead.finished, runner._ahead.abandoned) == (0, 1)


def test_a_transaction_committed_in_between_sends_the_big_one_after_its_commit(running: Any, pg: Any) -> None:
    runner, conn, _urls, same = running
    other = psycopg2.connect(pg.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute('UPDATE public."big one" SET n = 0 WHERE id > 100')
        _wait_parts(runner, 2)
        with other.cursor() as cur:
            cur.execute("UPDATE public.\"big one\" SET t = 'small' WHERE id <= 10")
        other.commit()  # committed first: it comes first in the log, so the big one cannot go on ahead
        wait_until(lambda: runner._ahead.abandoned >= 1, timeout=60, what="the big one is given up")
        conn.commit()
        wait_until(same, timeout=120, what="every target equals the source")
        assert runner._ahead.finished == 0
    finally:
        other.close()
