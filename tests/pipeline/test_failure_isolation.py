"""One failure stops only itself: of four targets replicating live, one is made to refuse a row of one
table (a CHECK added at a PostgreSQL or a Delta target, a trigger at a SQLite one, a unique index at a DuckDB one, a
row of the new key written by hand into an Iceberg one, which has no constraints).
That table stops alone at that target: the target's other table and the other targets stay current, the pipeline
keeps applying and tries the table again by itself; ``status`` shows the table ``stopped`` with the reason (text,
``--json``, Prometheus) and ``--check``'s problems name it; ``verify`` reports it as not comparable, never as a
difference; once the target takes the row again the table catches up, every target equal to the source (the tests'
own reader). ``catch_up`` (``run --once``, ``apply --once``) applies everything else before it raises the table's
error. With ``all_or_nothing = true`` the same refusal stops the whole target."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import configs
import duckdb
import oracle
import psycopg2
import pytest
from pipeline_support import target_url
from waiting import wait_until

from mirrorline import config as cfg
from mirrorline import status as status_mod
from mirrorline.capture.session import Capture
from mirrorline.errors import ApplyError, MirrorlineError
from mirrorline.pipeline import Applier
from mirrorline.snapshot.run import snapshot_target
from mirrorline.verify import verify

KINDS = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")
TABLES = ("public.items", "public.quiet")


def _config(
    pg: Any, tmp_path: Path, urls: dict[str, str], settings: dict[str, dict[str, Any]] | None = None
) -> cfg.Config:
    """``settings``: more settings of some targets, by name."""
    return configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables=TABLES,
        targets={name: {"url": url, **(settings or {}).get(name, {})} for name, url in urls.items()},
    )


def _refuse(kind: str, url: str) -> Callable[[], None]:
    """Make the target refuse an item whose v is 'bad'; returns what lets it take the row again."""
    if kind == "postgresql":
        conn = psycopg2.connect(url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ALTER TABLE public.items ADD CONSTRAINT no_bad CHECK (v <> 'bad')")
        conn.close()

        def allow() -> None:
            c = psycopg2.connect(url)
            c.autocommit = True
            with c.cursor() as cur:
                cur.execute("ALTER TABLE public.items DROP CONSTRAINT no_bad")
            c.close()

        return allow
    path = url.split(":///", 1)[1]
    if kind == "iceberg":  # another writer's row of the key to insert: the insert of (2, 'bad') finds it there
        import pyarrow as pa
        from pyiceberg.expressions import EqualTo

        table = oracle.iceberg_table(path, "public.items")
        table.append(pa.table({"id": [2], "v": ["by hand"]}).cast(table.schema().as_arrow()))
        return lambda: oracle.iceberg_table(path, "public.items").delete(EqualTo("id", 2))
    if kind == "delta":
        from deltalake import DeltaTable

        items = f"{path}/items"
        DeltaTable(items).alter.add_constraint({"no_bad": "v <> 'bad'"})
        return lambda: DeltaTable(items).alter.drop_constraint("no_bad")
    if kind == "duckdb":
        with duckdb.connect(path) as conn:  # a row of its own holds the one 'bad' the index allows
            conn.execute("INSERT INTO items VALUES (-1, 'bad'); CREATE UNIQUE INDEX no_bad ON items(v)")

        def allow_duck() -> None:
            with duckdb.connect(path) as c:
                c.execute("DROP INDEX no_bad; DELETE FROM items WHERE id = -1")

        return allow_duck
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TRIGGER no_bad BEFORE INSERT ON items WHEN NEW.v = 'bad' "
            "BEGIN SELECT RAISE(ABORT, 'no bad items here'); END"
        )

    def allow_sqlite() -> None:
        with sqlite3.connect(path) as c:
            c.execute("DROP TRIGGER no_bad")

    return allow_sqlite


def _same(pg: Any, kind: str, url: str, tables: tuple[str, ...] = TABLES) -> bool:
    try:
        for t in tables:
            oracle.assert_same(pg.dsn, kind, url, t)
    except AssertionError:
        return False
    return True


_wait = partial(wait_until, timeout=60.0, interval=0.2)  # this module's waits


def _start(
    pg: Any, pg_cluster: Any, tmp_path: Path, kinds: tuple[str, ...], **settings: dict[str, Any]
) -> tuple[cfg.Config, dict[str, str]]:
    pg.execute(
        "CREATE TABLE public.items (id integer PRIMARY KEY, v text); CREATE TABLE public.quiet (id integer PRIMARY "
        "KEY); INSERT INTO public.items VALUES (1, 'one'); INSERT INTO public.quiet VALUES (1)"
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"iso_{k[:2]}_{pg.name[-6:]}") for k in kinds}
    conf = _config(pg, tmp_path, urls, settings)
    Capture(conf, once=True).run()
    for name in urls:
        snapshot_target(conf, name)
    return conf, urls


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("failing", KINDS)
def test_a_table_refusing_a_row_stops_alone(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, failing: str) -> None:
    conf, urls = _start(pg, pg_cluster, tmp_path, KINDS)
    applier = Applier(conf, spark=spark)
    try:
        applier.catch_up()
        allow = _refuse(failing, urls[failing])
        others = [k for k in KINDS if k != failing]

        # catch_up: everything else applies (the failing target's other table too), then the table's error
        pg.execute("INSERT INTO public.items VALUES (2, 'bad'), (3, 'three'); UPDATE public.quiet SET id = 2")
        Capture(conf, once=True).run()
        with pytest.raises(ApplyError, match=r"public\.items"):
            applier.catch_up()
        for k in others:
            assert _same(pg, k, urls[k]), k
        assert _same(pg, failing, urls[failing], ("public.quiet",))
        assert not _same(pg, failing, urls[failing], ("public.items",))
        assert applier.failed() == {} and list(applier.held()) == [(failing, "public.items")]
        st = status_mod.status(conf)
        (t,) = [t for t in st.targets if t.name == failing]
        assert t.tables["public.items"] == status_mod.STOPPED and t.tables["public.quiet"] == "loaded"
        assert t.stopped_tables["public.items"]["since"] and "public.items" in t.stopped_tables["public.items"]["error"]
        assert t.to_json()["stopped_tables"]["public.items"]["error"]
        assert f'mirrorline_table_stopped{{target="{failing}",table="public.items"}} 1' in (
            status_mod.render_prometheus(st)
        )
        assert any(p.startswith(f"target {failing}: table public.items stopped") for p in st.problems())
        assert all(t.state == "live" and not t.stopped_tables for t in st.targets if t.name != failing)
        # verify: the table stopped alone is not comparable, never a difference; the rest is compared
        report = verify(conf)
        (check,) = [c for c in report.targets if c.target == failing]
        (items,) = [c for c in check.tables if c.table == "public.items"]
        assert items.equal and not items.same and "stopped at the target" in items.not_comparable
        assert all(c.same for c in check.tables if c.table != "public.items") and report.ok, report.text()

        # live: the pipeline keeps applying, and tries the table again by itself
        applier.retry_first = 0.2
        stop = threading.Event()
        errors: list[BaseException] = []

        def follow() -> None:
            try:
                applier.follow(stop)
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        try:
            pg.execute("INSERT INTO public.items VALUES (4, 'four'); UPDATE public.quiet SET id = 3")
            Capture(conf, once=True).run()
            for k in others:
                _wait(lambda k=k: _same(pg, k, urls[k]), what=f"the {k} target is current")
            _wait(lambda: _same(pg, failing, urls[failing], ("public.quiet",)), what="the other table is current")
            assert not _same(pg, failing, urls[failing], ("public.items",)) and not errors
            allow()
            _wait(lambda: _same(pg, failing, urls[failing]), what=f"the table at {failing} catches up by itself")
            _wait(lambda: applier.held() == {}, what="it is no longer held")
        finally:
            stop.set()
            thread.join(30)
        assert not errors, errors
        assert applier.failed() == {}
        st = status_mod.status(conf)
        assert all(t.state == "live" and not t.error and not t.stopped_tables for t in st.targets)
        assert all(c.same for tc in verify(conf).targets for c in tc.tables)
    finally:
        applier.close()


@pytest.mark.pg
@pytest.mark.spark
def test_all_or_nothing_stops_the_whole_target(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    """``all_or_nothing = true``: the table's refusal stops the target (its other table too); the other target goes
    on; once the row is taken, the target catches up whole."""
    conf, urls = _start(pg, pg_cluster, tmp_path, ("sqlite", "duckdb"), sqlite={"all_or_nothing": True})
    applier = Applier(conf, spark=spark)
    try:
        applier.catch_up()
        allow = _refuse("sqlite", urls["sqlite"])
        pg.execute("INSERT INTO public.items VALUES (2, 'bad'); UPDATE public.quiet SET id = 2")
        Capture(conf, once=True).run()
        with pytest.raises(MirrorlineError, match=r"public\.items"):
            applier.catch_up()
        assert _same(pg, "duckdb", urls["duckdb"])
        assert not _same(pg, "sqlite", urls["sqlite"], ("public.quiet",))
        assert list(applier.failed()) == ["sqlite"] and applier.held() == {}
        allow()
        applier.catch_up()
        assert _same(pg, "sqlite", urls["sqlite"]) and applier.failed() == {}
    finally:
        applier.close()


@pytest.mark.pg
@pytest.mark.spark
def test_status_sees_a_dead_capture(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    """With nothing capturing, a change committed at the source is lag at every target (peeked from the slot, not
    consumed), and a problem for ``--check``; once captured and applied, both go."""
    pg.execute(
        "CREATE TABLE public.items (id integer PRIMARY KEY, v text); CREATE TABLE public.quiet (id integer PRIMARY "
        "KEY); INSERT INTO public.items VALUES (1, 'one')"
    )
    url = target_url("sqlite", tmp_path, pg_cluster, "dead")
    conf = _config(pg, tmp_path, {"lite": url})
    Capture(conf, once=True).run()
    snapshot_target(conf, "lite")
    st = status_mod.status(conf)
    assert st.problems(max_lag=30) == [] and st.targets[0].lag_seconds == 0.0
    pg.execute("UPDATE public.items SET v = 'uno'")
    time.sleep(1.5)
    st = status_mod.status(conf)
    (problem,) = st.problems()
    assert "capture is not running" in problem and conf.source is not None and conf.source.slot in problem
    assert (st.targets[0].lag_seconds or 0) >= 1.4
    assert any(p.startswith("target lite is ") and p.endswith("(more than 1 s)") for p in st.problems(max_lag=1.0))
    # the peek consumed nothing: capture still gets the change
    Capture(conf, once=True).run()
    applier = Applier(conf, spark=spark)
    try:
        applier.catch_up()
    finally:
        applier.close()
    assert _same(pg, "sqlite", url)
    st = status_mod.status(conf)
    assert st.problems(max_lag=30) == [] and st.targets[0].lag_seconds == 0.0


@pytest.mark.pg
@pytest.mark.spark
def test_an_unreachable_target_is_retried_while_the_others_go_on(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path
) -> None:
    """The PostgreSQL target refuses connections for a while (as a server down or restarting would): the SQLite
    target stays current, the pipeline keeps running and tries the PostgreSQL one again until it is back."""
    pg.execute(
        "CREATE TABLE public.items (id integer PRIMARY KEY, v text); CREATE TABLE public.quiet (id integer PRIMARY "
        "KEY); INSERT INTO public.items VALUES (1, 'one')"
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"un_{k[:2]}_{pg.name[-6:]}") for k in ("postgresql", "sqlite")}
    conf = _config(pg, tmp_path, urls)
    Capture(conf, once=True).run()
    for name in urls:
        snapshot_target(conf, name)
    db = urls["postgresql"].rsplit("/", 1)[1]
    applier = Applier(conf, spark=spark)
    applier.retry_first = 0.5
    stop = threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            applier.follow(stop)
        except BaseException as e:  # handed to the test
            errors.append(e)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        pg_cluster.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        pg_cluster.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")
        for i in range(2, 5):
            pg.execute(f"INSERT INTO public.items VALUES ({i}, 'v{i}')")
            Capture(conf, once=True).run()
            _wait(lambda: _same(pg, "sqlite", urls["sqlite"]), what="the sqlite target is current")
        _wait(lambda: "postgresql" in applier.failed(), what="the postgresql target is stopped")
        st = status_mod.status(conf)
        assert any(p.startswith("target postgresql") for p in st.problems())
        time.sleep(2)  # a few tries while it is away
        assert not errors and thread.is_alive()
        pg_cluster.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        _wait(lambda: _same(pg, "postgresql", urls["postgresql"]), what="the postgresql target catches up")
        _wait(lambda: applier.failed() == {}, what="it is no longer stopped")
    finally:
        pg_cluster.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        stop.set()
        thread.join(30)
        applier.close()
    assert not errors, errors
    assert all(not t.error for t in status_mod.status(conf).targets)


@pytest.mark.pg
@pytest.mark.spark
def test_kill_while_a_table_is_stopped(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    """``run`` killed (SIGKILL) twice while a table is stopped alone at a SQLite target, with changes to it and
    to the other table between the kills: each start keeps it stopped (tried once, refused again), the other table
    and the PostgreSQL target stay current; once the target takes the row, the table catches up: nothing lost, nothing
    applied twice (the tests' own reader, on both tables at both targets)."""
    import random
    import signal

    from crash_support import mirrorline_process

    rng = random.Random(36)
    conf, urls = _start(pg, pg_cluster, tmp_path, ("sqlite", "postgresql"))
    cfg_path = str(tmp_path / "m.toml")
    allow = _refuse("sqlite", urls["sqlite"])

    def held() -> dict[str, dict[str, str]]:
        (t,) = [t for t in status_mod.status(conf).targets if t.name == "sqlite"]
        return t.stopped_tables

    proc = mirrorline_process("run", "-c", cfg_path, log_file=tmp_path / "run.log")
    try:
        pg.execute("INSERT INTO public.items VALUES (2, 'bad'), (3, 'three'); UPDATE public.quiet SET id = 2")
        _wait(lambda: "public.items" in held(), timeout=120, what="the table is stopped at sqlite")
        for i in range(2):
            pg.execute(
                f"INSERT INTO public.items VALUES ({10 + i}, 'v{i}'); UPDATE public.items SET v = 'w{i}' WHERE id = 3;"
                f"UPDATE public.quiet SET id = {3 + i}"
            )
            _wait(lambda: _same(pg, "postgresql", urls["postgresql"]), timeout=120, what="postgresql is current")
            _wait(lambda: _same(pg, "sqlite", urls["sqlite"], ("public.quiet",)), what="the other table is current")
            time.sleep(rng.uniform(0.0, 2.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert "public.items" in held()
            proc = mirrorline_process("run", "-c", cfg_path, log_file=tmp_path / "run.log")
        _wait(
            lambda: "trying it again" in (tmp_path / "run.log").read_text(), what="it is refused again after the start"
        )
        assert not _same(pg, "sqlite", urls["sqlite"], ("public.items",))
        allow()
        pg.execute("DELETE FROM public.items WHERE id = 10")
        _wait(lambda: _same(pg, "sqlite", urls["sqlite"]), timeout=180, what="the table catches up")
        _wait(lambda: not held(), what="it is no longer stopped")
        _wait(lambda: _same(pg, "postgresql", urls["postgresql"]), what="postgresql is current")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
