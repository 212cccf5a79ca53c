"""``run`` applies a streamed transaction ahead of its commit (pipeline/ahead.py): its parts reach every target
while the source's transaction is still open, nothing of it is visible there before the source commits, and the
targets equal the source after the commit (the key first, composite and last, a partitioned table; keys changed),
the abort of the transaction or of a subtransaction, a transaction committed in between, a target that fails a part
(it leaves; the others commit ahead) and a reload of the configuration that removes a target or adds a table. Each
target is read by the kind's own client (tests/support/oracle.py)."""

from __future__ import annotations

from dataclasses import dataclass
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
# the table's shapes: the key first; composite and last (a key change moves rows); partitioned (rows move between
# partitions)
SHAPES = {
    "plain": ('CREATE TABLE public."big one" (id bigint PRIMARY KEY, n int, t text)', ["id", "n", "t"]),
    "composite": (
        'CREATE TABLE public."big one" (n int, t text, id bigint, k int NOT NULL DEFAULT 1, PRIMARY KEY (id, k))',
        ["id", "k", "n", "t"],
    ),
    "partitioned": (
        'CREATE TABLE public."big one" (id bigint PRIMARY KEY, n int, t text) PARTITION BY RANGE (id);'
        'CREATE TABLE public."big one lo" PARTITION OF public."big one" FOR VALUES FROM (MINVALUE) TO (1500);'
        'CREATE TABLE public."big one hi" PARTITION OF public."big one" FOR VALUES FROM (1500) TO (MAXVALUE)',
        ["id", "n", "t"],
    ),
}


def _location(url: str) -> str:
    return url.split(":///", 1)[1] if url.startswith(("sqlite:", "duckdb:")) else url


def source_rows(dsn: str, cols: list[str], table: str = "big one") -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'SELECT {", ".join(cols)} FROM public."{table}" ORDER BY 1, 2')
            return list(cur.fetchall())
    finally:
        conn.close()


def target_rows(kind: str, url: str, cols: list[str], table: str = "big one") -> list[tuple[Any, ...]]:
    return sorted(oracle.read(kind, _location(url), f"public.{table}", cols) or [])


@dataclass
class Running:
    runner: Any
    conn: Any
    urls: dict[str, str]
    cols: list[str]
    thread: RunnerThread
    dsn: str

    def rows(self) -> dict[str, list[tuple[Any, ...]]]:
        return {k: target_rows(k, u, self.cols) for k, u in self.urls.items()}

    def same(self, kinds: list[str] | None = None) -> bool:
        assert not self.thread.errors, self.thread.errors
        want = source_rows(self.dsn, self.cols)
        return all(target_rows(k, u, self.cols) == want for k, u in self.urls.items() if kinds is None or k in kinds)


@pytest.fixture
def running(
    request: pytest.FixtureRequest,
    pg: Any,
    spark: Any,
    tmp_path: Path,
    target_dbs: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    monkeypatch.setattr(limits, "AHEAD_ROWS", 500)  # the test cluster streams past 64 kB: many small blocks
    ddl, cols = SHAPES[getattr(request, "param", "plain")]
    pg.execute(
        f"{ddl};"
        f"""INSERT INTO public."big one" (id, n, t) SELECT g, g, md5(g::text) FROM generate_series(1, {ROWS}) g;"""
        'CREATE TABLE public."later one" (id int PRIMARY KEY, v text);'
        "INSERT INTO public.\"later one\" VALUES (1, 'there before')"
    )
    urls = target_urls(tmp_path, pg.cluster, ["postgresql", "sqlite", "duckdb"], target_dbs)
    config = write_config(tmp_path, pg.dsn, urls, {"public.big one": {}})
    reconcile_targets(config, options=Options(progress=False))
    runner = Runner(config)
    thread = RunnerThread(runner)
    thread.start()
    conn = psycopg2.connect(pg.dsn)
    r = Running(runner, conn, urls, cols, thread, pg.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO public.\"big one\" (id, n, t) VALUES (0, 0, 'start')")
        conn.commit()
        wait_until(r.same, timeout=120, what="every target has the first change")
        yield r
    finally:
        conn.close()
        runner.stop()
        thread.join(60)
    assert not thread.errors, thread.errors


def _wait_parts(runner: Any, n: int) -> None:
    wait_until(lambda: runner._ahead.parts >= n, timeout=60, what=f"{n} parts are applied ahead")


@pytest.mark.parametrize("running", list(SHAPES), indirect=True)
def test_a_big_transaction_is_applied_while_open_and_shown_at_its_commit(running: Running) -> None:
    r = running
    before = r.rows()
    with r.conn.cursor() as cur:
        cur.execute("UPDATE public.\"big one\" SET n = n + 1, t = t || 'x'")  # every row: nothing folds
        cur.execute(
            "INSERT INTO public.\"big one\" (id, n, t) SELECT g, g, 'new'"
            f" FROM generate_series({ROWS + 1}, {ROWS * 2}) g"
        )
        cur.execute('UPDATE public."big one" SET n = -n WHERE id % 3 = 0')  # keys changed twice: parts fold
        cur.execute('UPDATE public."big one" SET id = id + 100000 WHERE id % 11 = 0')  # keys changed (rows moved)
        cur.execute('DELETE FROM public."big one" WHERE id % 7 = 0')
        cur.execute("INSERT INTO public.\"big one\" (id, n, t) SELECT g, 1, 'tail' FROM generate_series(-40, -1) g")
    _wait_parts(r.runner, 4)
    assert r.rows() == before  # applied, not committed
    r.conn.commit()
    wait_until(r.same, timeout=120, what="every target equals the source after the commit")
    wait_until(lambda: r.runner._ahead.finished == 1, timeout=10, what="the transaction is counted as committed ahead")
    assert r.runner._ahead.abandoned == 0


def test_an_aborted_transaction_applied_ahead_leaves_nothing(running: Running) -> None:
    r = running
    with r.conn.cursor() as cur:
        cur.execute("UPDATE public.\"big one\" SET t = 'gone'")
        cur.execute('DELETE FROM public."big one" WHERE id > 10')
    _wait_parts(r.runner, 2)
    r.conn.rollback()
    wait_until(lambda: r.runner._ahead.abandoned >= 1, timeout=60, what="the transaction is given up")
    with r.conn.cursor() as cur:
        cur.execute("UPDATE public.\"big one\" SET t = 'after' WHERE id = 5")
    r.conn.commit()
    wait_until(r.same, timeout=120, what="every target equals the source after the abort")
    assert r.runner._ahead.finished == 0


def test_a_subtransaction_aborted_after_its_rows_were_applied(running: Running) -> None:
    r = running
    with r.conn.cursor() as cur:
        cur.execute('UPDATE public."big one" SET n = 7 WHERE id <= 1000')
        cur.execute("SAVEPOINT s1")
        cur.execute("UPDATE public.\"big one\" SET t = 'rolled back'")
        _wait_parts(r.runner, 3)
        cur.execute("ROLLBACK TO SAVEPOINT s1")
        cur.execute('DELETE FROM public."big one" WHERE id > 2000')
    r.conn.commit()
    wait_until(r.same, timeout=120, what="every target equals the source")
    assert (r.runner._ahead.finished, r.runner._ahead.abandoned) == (0, 1)


def test_a_transaction_committed_in_between_sends_the_big_one_after_its_commit(running: Running, pg: Any) -> None:
    r = running
    other = psycopg2.connect(pg.dsn)
    try:
        with r.conn.cursor() as cur:
            cur.execute('UPDATE public."big one" SET n = 0 WHERE id > 100')
        _wait_parts(r.runner, 2)
        with other.cursor() as cur:
            cur.execute("UPDATE public.\"big one\" SET t = 'small' WHERE id <= 10")
        other.commit()  # committed first: it comes first in the log, so the big one cannot go on ahead
        wait_until(lambda: r.runner._ahead.abandoned >= 1, timeout=60, what="the big one is given up")
        r.conn.commit()
        wait_until(r.same, timeout=120, what="every target equals the source")
        assert r.runner._ahead.finished == 0
    finally:
        other.close()


def test_a_target_that_fails_a_part_leaves_and_the_others_commit_ahead(running: Running) -> None:
    """A value the PostgreSQL target cannot take (its column narrowed there): that target's transaction is rolled
    back and the table stops there alone after the commit; the other targets commit the transaction ahead. Once the
    target takes the value, it catches up."""
    r = running
    pg_url = r.urls["postgresql"]
    target = psycopg2.connect(pg_url)
    target.autocommit = True
    try:
        with target.cursor() as cur:
            cur.execute('ALTER TABLE public."big one" ALTER t TYPE varchar(40)')
        before = r.rows()["postgresql"]
        with r.conn.cursor() as cur:
            cur.execute('UPDATE public."big one" SET n = n + 1')
            _wait_parts(r.runner, 2)
            cur.execute("UPDATE public.\"big one\" SET t = repeat('long ', 20) WHERE id = 2900")
            cur.execute('UPDATE public."big one" SET n = n + 1 WHERE id > 2000')
        r.conn.commit()
        wait_until(lambda: r.same(["sqlite", "duckdb"]), timeout=120, what="the other targets equal the source")
        wait_until(lambda: r.runner._ahead.finished == 1, timeout=10, what="committed ahead at the others")
        wait_until(
            lambda: (
                ("postgresql", "public.big one") in r.runner._applier.held()
                or "postgresql" in r.runner._applier.failed()
            ),
            timeout=60,
            what="the table stopped at the PostgreSQL target",
        )
        assert r.rows()["postgresql"] == before  # nothing of the transaction was committed there
        with target.cursor() as cur:
            cur.execute('ALTER TABLE public."big one" ALTER t TYPE text')
        wait_until(r.same, timeout=180, what="the PostgreSQL target catches up once it takes the value")
    finally:
        target.close()


def test_a_target_removed_while_a_transaction_is_applied_ahead(running: Running, pg: Any, tmp_path: Path) -> None:
    """A reload that removes a target while a transaction is applied ahead: what was applied there is rolled back
    (the target is left where it was), and the others apply the transaction after its commit."""
    r = running
    before = r.rows()["sqlite"]
    with r.conn.cursor() as cur:
        cur.execute('UPDATE public."big one" SET n = n * 2')
        _wait_parts(r.runner, 2)
        write_config(tmp_path, pg.dsn, {k: u for k, u in r.urls.items() if k != "sqlite"}, {"public.big one": {}})
        r.runner.request_reload()
        wait_until(lambda: r.runner._ahead.abandoned >= 1, timeout=60, what="the transaction is given up")
        cur.execute('UPDATE public."big one" SET t = upper(t) WHERE id < 1000')
    r.conn.commit()
    wait_until(lambda: r.same(["postgresql", "duckdb"]), timeout=180, what="the targets kept equal the source")
    assert r.rows()["sqlite"] == before
    assert r.runner._ahead.finished == 0


def test_a_reload_of_the_configuration_rolls_back_what_was_applied_ahead(
    running: Running, pg: Any, tmp_path: Path
) -> None:
    """A table added by a reload while a transaction is applied ahead (capture starts again, each target pauses to
    load the table): what was applied ahead is rolled back, and the transaction is applied after its commit."""
    r = running
    with r.conn.cursor() as cur:
        cur.execute('UPDATE public."big one" SET n = n * 2')
        cur.execute("INSERT INTO public.\"later one\" VALUES (2, 'in the big transaction')")
        _wait_parts(r.runner, 2)
        write_config(tmp_path, pg.dsn, r.urls, {"public.big one": {}, "public.later one": {}})
        r.runner.request_reload()
        wait_until(lambda: r.runner._ahead.abandoned >= 1, timeout=60, what="the transaction is given up")
        cur.execute('UPDATE public."big one" SET t = upper(t) WHERE id < 1000')
    r.conn.commit()
    wait_until(r.same, timeout=180, what="every target equals the source")
    later = source_rows(r.dsn, ["id", "v"], "later one")
    wait_until(
        lambda: all(target_rows(k, u, ["id", "v"], "later one") == later for k, u in r.urls.items()),
        timeout=120,
        what="the added table is at every target",
    )
    assert r.runner._ahead.finished == 0
