"""One failure stops only itself (issue 36): of three targets replicating live, one is made to refuse a row (a CHECK
added at a PostgreSQL target, a trigger at a SQLite one). The others stay current, the pipeline keeps applying and
tries the stopped target again by itself; ``status`` shows it ``stopped`` with the reason and ``--check``'s problems
name it; once the target takes the row again it catches up, every target equal to the source (the tests' own
reader). ``catch_up`` (``run --once``, ``apply --once``) applies every other target before it raises the stopped
one's error."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from mirrorline import config as cfg
from mirrorline import status as status_mod
from mirrorline.capture.session import Capture
from mirrorline.errors import ApplyError
from mirrorline.pipeline import Applier
from mirrorline.snapshot.run import snapshot_target
from tests import oracle
from tests.pipeline_support import target_url

KINDS = ("postgresql", "sqlite", "duckdb")
TABLES = ("public.items", "public.quiet")


def _config(pg: Any, tmp_path: Path, urls: dict[str, str]) -> cfg.Config:
    lines = ["[source]", f'dsn = "{pg.dsn}"', "[log]", f'path = "{tmp_path / "log"}"', "[apply]", 'latency = "100ms"']
    lines += [f'[tables."{t}"]' for t in TABLES]
    for name, url in urls.items():
        lines += [f"[targets.{name}]", f'url = "{url}"']
    (tmp_path / "m.toml").write_text("\n".join(lines) + "\n")
    return cfg.load(tmp_path / "m.toml")


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
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TRIGGER no_bad BEFORE INSERT ON items WHEN NEW.v = 'bad' "
            "BEGIN SELECT RAISE(ABORT, 'no bad items here'); END"
        )

    def allow_sqlite() -> None:
        with sqlite3.connect(path) as c:
            c.execute("DROP TRIGGER no_bad")

    return allow_sqlite


def _same(pg: Any, kind: str, url: str) -> bool:
    try:
        for t in TABLES:
            oracle.assert_same(pg.dsn, kind, url, t)
    except AssertionError:
        return False
    return True


def _wait(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("failing", ["postgresql", "sqlite"])
def test_one_target_refusing_a_row_stops_only_itself(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, failing: str
) -> None:
    pg.execute(
        "CREATE TABLE public.items (id integer PRIMARY KEY, v text); CREATE TABLE public.quiet (id integer PRIMARY "
        "KEY); INSERT INTO public.items VALUES (1, 'one'); INSERT INTO public.quiet VALUES (1)"
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"iso_{k[:2]}_{pg.name[-6:]}") for k in KINDS}
    conf = _config(pg, tmp_path, urls)
    Capture(conf, once=True).run()
    for name in urls:
        snapshot_target(conf, name)
    allow = _refuse(failing, urls[failing])
    others = [k for k in KINDS if k != failing]

    # catch_up: every other target applies everything, then the stopped one's error is raised
    pg.execute("INSERT INTO public.items VALUES (2, 'bad'), (3, 'three')")
    Capture(conf, once=True).run()
    applier = Applier(conf, spark=spark)
    try:
        with pytest.raises(ApplyError, match=r"public\.items key \['2'\]"):
            applier.catch_up()
        for k in others:
            assert _same(pg, k, urls[k]), k
        assert not _same(pg, failing, urls[failing])
        st = status_mod.status(conf)
        (t,) = [t for t in st.targets if t.name == failing]
        assert t.state == "stopped" and "public.items" in t.error
        assert any(failing in p for p in st.problems())
        assert [t.state for t in st.targets if t.name != failing] == ["live", "live"]

        # live: the pipeline keeps applying to the others and tries the stopped target again by itself
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
            pg.execute("INSERT INTO public.items VALUES (4, 'four'); UPDATE public.quiet SET id = 2")
            Capture(conf, once=True).run()
            for k in others:
                _wait(f"the {k} target is current", lambda k=k: _same(pg, k, urls[k]))
            assert not _same(pg, failing, urls[failing]) and not errors
            allow()
            _wait(f"the {failing} target catches up by itself", lambda: _same(pg, failing, urls[failing]))
        finally:
            stop.set()
            thread.join(30)
        assert not errors, errors
        assert applier.failed() == {}
        assert all(t.state == "live" and not t.error for t in status_mod.status(conf).targets)
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
            _wait("the sqlite target is current", lambda: _same(pg, "sqlite", urls["sqlite"]))
        _wait("the postgresql target is stopped", lambda: "postgresql" in applier.failed())
        st = status_mod.status(conf)
        assert any(p.startswith("target postgresql") for p in st.problems())
        time.sleep(2)  # a few tries while it is away
        assert not errors and thread.is_alive()
        pg_cluster.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        _wait("the postgresql target catches up", lambda: _same(pg, "postgresql", urls["postgresql"]))
        _wait("it is no longer stopped", lambda: applier.failed() == {})
    finally:
        pg_cluster.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        stop.set()
        thread.join(30)
        applier.close()
    assert not errors, errors
    assert all(not t.error for t in status_mod.status(conf).targets)
