"""The source side of capture against a real PostgreSQL: configured tables checked (missing table, no usable key),
the publication reconciled with the configuration at every start (and what changed reported), the slot, and the
`mirrorline capture` command's one-line errors and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import configs
import pytest
from waiting import wait_until

from mirrorline.capture.provision import ensure_slot, reconcile_publication
from mirrorline.capture.source import connect, describe_tables
from mirrorline.config import Config, parse
from mirrorline.errors import ConfigError, SourceError
from mirrorline.log.reader import ChangeLog
from mirrorline.pgcluster import free_port

pytestmark = pytest.mark.pg


def config(dsn: str, folder: Path, tables: dict[str, dict[str, Any]]) -> Config:
    return parse(
        {"source": {"dsn": dsn}, "log": {"path": str(folder / "log")}, "tables": tables}, folder / "mirrorline.toml"
    )


def write_config(folder: Path, dsn: str, tables: list[str]) -> Path:
    return configs.write(folder / "mirrorline.toml", source=dsn, log="log", tables=tables)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mirrorline.cli.main", "capture", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def conn(pg: Any) -> Any:
    c = connect(pg.dsn)
    yield c
    c.close()


def test_tables_keys_and_identities(pg: Any, conn: Any, tmp_path: Path) -> None:
    pg.execute("""
        CREATE TABLE pk (id int PRIMARY KEY, v text NOT NULL);
        CREATE TABLE full_t (a int, b text); ALTER TABLE full_t REPLICA IDENTITY FULL;
        CREATE TABLE idx (a int NOT NULL, b int NOT NULL, c text);
        CREATE UNIQUE INDEX idx_ab ON idx (b, a); ALTER TABLE idx REPLICA IDENTITY USING INDEX idx_ab;
    """)
    tables = describe_tables(
        conn, config(pg.dsn, tmp_path, {"public.pk": {}, "public.full_t": {}, "public.idx": {"key": ["a"]}})
    )
    assert tables["public.pk"].primary_key == ("id",) and tables["public.pk"].info.not_null == {"id", "v"}
    assert tables["public.full_t"].identity == ("a", "b") and tables["public.full_t"].primary_key == ()
    assert tables["public.idx"].identity == ("b", "a") and tables["public.idx"].info.key == ("a",)
    assert [c.type_name for c in tables["public.pk"].columns] == ["integer", "text"]


@pytest.mark.parametrize(
    ("setup", "tables", "message"),
    [
        ("", {"public.nope": {}}, r'tables\."public\.nope": no table public\.nope in the source database'),
        ("CREATE TABLE t (a int)", {"public.t": {}}, "has no primary key and no REPLICA IDENTITY FULL"),
        (
            "CREATE TABLE t (a int PRIMARY KEY); ALTER TABLE t REPLICA IDENTITY NOTHING",
            {"public.t": {}},
            "REPLICA IDENTITY NOTHING",
        ),
        ("CREATE VIEW t AS SELECT 1 AS a", {"public.t": {}}, "is a view"),
        (
            "CREATE TABLE t (a int PRIMARY KEY, b int)",
            {"public.t": {"key": ["b"]}},
            "not in public.t's replica identity",
        ),
        ("CREATE TABLE t (a int PRIMARY KEY)", {"public.t": {"key": ["zz"]}}, "has no column"),
    ],
)
def test_tables_that_cannot_be_captured_are_clear_errors(
    pg: Any, conn: Any, tmp_path: Path, setup: str, tables: dict[str, Any], message: str
) -> None:
    if setup:
        pg.execute(setup)
    with pytest.raises(ConfigError, match=message) as e:
        describe_tables(conn, config(pg.dsn, tmp_path, tables))
    assert e.value.exit_code == 2 and "mirrorline.toml" in str(e.value)


def test_a_table_of_text_without_a_key_is_a_bag_keyed_on_every_column(pg: Any, conn: Any, tmp_path: Path) -> None:
    """No primary key, REPLICA IDENTITY FULL, only text and jsonb columns: every column identifies a row,
    and the ALTER TABLE to run is named when the identity is missing."""
    pg.execute("CREATE TABLE t (a text, b jsonb)")
    with pytest.raises(ConfigError, match="no REPLICA IDENTITY FULL") as e:
        describe_tables(conn, config(pg.dsn, tmp_path, {"public.t": {}}))
    assert 'ALTER TABLE "public"."t" REPLICA IDENTITY FULL' in str(e.value)
    pg.execute("ALTER TABLE t REPLICA IDENTITY FULL")
    t = describe_tables(conn, config(pg.dsn, tmp_path, {"public.t": {}}))["public.t"]
    assert t.replica_identity == "f" and t.primary_key == () and [c.name for c in t.columns] == ["a", "b"]


def test_every_table_lacking_an_identity_is_named_at_once(pg: Any, conn: Any, tmp_path: Path) -> None:
    """Three tables without a usable identity: one error names all three, and for the one with a unique index on NOT
    NULL columns it advises REPLICA IDENTITY USING INDEX (the others: FULL)."""
    pg.execute(
        'CREATE TABLE a (x int); CREATE TABLE "B" (x int NOT NULL, y int); CREATE UNIQUE INDEX "B x" ON "B" (x);'
        "CREATE TABLE d (x int); CREATE UNIQUE INDEX d_x ON d (x); CREATE TABLE ok (id int PRIMARY KEY)"
    )
    tables = {"public.a": {}, "public.B": {}, "public.d": {}, "public.ok": {}}
    with pytest.raises(ConfigError) as e:
        describe_tables(conn, config(pg.dsn, tmp_path, tables))
    text = str(e.value)
    assert all(f"{t} has no primary key" in text for t in ("public.a", "public.B", "public.d")), text
    assert 'ALTER TABLE "public"."B" REPLICA IDENTITY USING INDEX "B x"' in text
    assert (
        'ALTER TABLE "public"."a" REPLICA IDENTITY FULL' in text
        and 'ALTER TABLE "public"."d" REPLICA IDENTITY FULL' in text
    )
    pg.execute('ALTER TABLE "B" REPLICA IDENTITY USING INDEX "B x"')
    described = describe_tables(conn, config(pg.dsn, tmp_path, tables), keyless_ok=True)
    assert described["public.B"].identity == ("x",)
    assert described["public.a"].replica_identity == "f" and described["public.a"].identity == ("x",)


def test_publication_is_reconciled_with_the_configuration(pg: Any, conn: Any) -> None:
    pg.execute(
        "CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY); "
        'CREATE SCHEMA "Odd"; CREATE TABLE "Odd"."c d" (id int PRIMARY KEY)'
    )
    r = reconcile_publication(conn, "pub", ["public.a", "public.b"], "s")
    assert (r.created, r.added, r.removed) == (True, ["public.a", "public.b"], [])
    r = reconcile_publication(conn, "pub", ["public.a", "public.b"], "s")
    assert not r.changed and r.summary() == "publication pub: unchanged"
    r = reconcile_publication(conn, "pub", ["public.b", "Odd.c d"], "s")
    assert (r.created, r.added, r.removed) == (False, ["Odd.c d"], ["public.a"])
    assert r.summary() == "publication pub: added Odd.c d; removed public.a"
    rows = pg.execute(
        "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'pub' ORDER BY 1"
    )
    assert rows == [("Odd.c d",), ("public.b",)]
    pg.execute("ALTER PUBLICATION pub SET (publish = 'insert')")
    r = reconcile_publication(conn, "pub", ["public.b", "Odd.c d"], "s")
    assert r.publish_fixed
    assert pg.execute("SELECT pubupdate AND pubdelete AND pubtruncate FROM pg_publication") == [(True,)]


def test_a_publication_another_log_owns_is_refused(pg: Any, conn: Any) -> None:
    """Two configurations on one source naming the same publication (their slots differ): the second is refused
    before it changes what the first receives; a publication of its own works beside."""
    pg.execute("CREATE TABLE t1 (id int PRIMARY KEY); CREATE TABLE t2 (id int PRIMARY KEY)")
    reconcile_publication(conn, "shared", ["public.t1"], "app_x")
    with pytest.raises(SourceError, match=r"belongs to another mirrorline log \(the one at app_x\)") as e:
        reconcile_publication(conn, "shared", ["public.t2"], "app_y")
    assert "publication of its own" in (e.value.hint or "")
    rows = pg.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'shared'")
    assert rows == [("t1",)]
    reconcile_publication(conn, "app_y", ["public.t2"], "app_y")
    assert reconcile_publication(conn, "shared", ["public.t1"], "app_x").summary() == "publication shared: unchanged"


def test_publication_for_all_tables_is_refused(pg: Any, conn: Any) -> None:
    pg.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE PUBLICATION everything FOR ALL TABLES")
    with pytest.raises(SourceError, match="FOR ALL TABLES"):
        reconcile_publication(conn, "everything", ["public.a"], "s")


def test_slot_created_once_and_a_foreign_slot_refused(pg: Any, conn: Any) -> None:
    assert ensure_slot(conn, "s1") is True
    assert ensure_slot(conn, "s1") is False
    pg.execute("SELECT pg_create_logical_replication_slot('s2', 'test_decoding')")
    with pytest.raises(SourceError, match="plugin test_decoding"):
        ensure_slot(conn, "s2")


# ------------------------------------------------------------------------------------------------ the command


def test_capture_command_reports_reconcile_and_captures(pg: Any, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    r = run_cli("--once", "-c", str(write_config(tmp_path, pg.dsn, ["public.a"])))
    assert r.returncode == 0, r.stderr
    assert "publication mirrorline: created; added public.a" in r.stderr
    assert "replication slot mirrorline created" in r.stderr
    pg.execute("INSERT INTO a VALUES (1), (2)")
    r = run_cli("--once", "-c", str(write_config(tmp_path, pg.dsn, ["public.a", "public.b"])))
    assert r.returncode == 0, r.stderr
    assert "publication mirrorline: added public.b" in r.stderr and "captured 2 changes in 1 transactions" in r.stderr
    pg.execute("INSERT INTO b VALUES (1)")
    pg.execute("INSERT INTO a VALUES (3)")  # committed while a is published, but a is no longer configured
    r = run_cli("--once", "-c", str(write_config(tmp_path, pg.dsn, ["public.b"])))
    assert r.returncode == 0, r.stderr
    assert "publication mirrorline: removed public.a" in r.stderr and "captured 1 changes" in r.stderr
    pg.execute("INSERT INTO a VALUES (4)")  # not published any more
    pg.execute("INSERT INTO b VALUES (2)")
    r = run_cli("--once", "-c", str(write_config(tmp_path, pg.dsn, ["public.b"])))
    assert r.returncode == 0, r.stderr
    assert "publication mirrorline: unchanged" in r.stderr and "captured 1 changes" in r.stderr
    keys = [(c.table, c.key) for c in ChangeLog(tmp_path / "log").read()]
    assert keys == [("public.a", ("1",)), ("public.a", ("2",)), ("public.b", ("1",)), ("public.b", ("2",))]


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_unreachable_server_is_one_line_exit_3(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, f"postgresql://app:s3cret@127.0.0.1:{free_port()}/app", ["public.a"])
    r = run_cli("--once", "-c", str(cfg))
    line = _one_line_error(r)
    assert r.returncode == 3
    assert line.startswith("mirrorline capture: cannot connect to the source") and "s3cret" not in r.stderr
    assert "is the server running" in line


def test_wrong_credentials_are_one_line_exit_3_without_the_password(pg: Any, tmp_path: Path) -> None:
    dsn = pg.dsn.replace("user=postgres", "user=nobody password=hunter2")
    cfg = write_config(tmp_path, dsn, ["public.a"])
    r = run_cli("--once", "-c", str(cfg))
    line = _one_line_error(r)
    assert r.returncode == 3
    assert 'role "nobody" does not exist' in line and "PGPASSWORD" in line and "hunter2" not in r.stderr


def test_missing_table_is_one_line_exit_2(pg: Any, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, pg.dsn, ["public.missing"])
    r = run_cli("--once", "-c", str(cfg))
    line = _one_line_error(r)
    assert r.returncode == 2
    assert 'tables."public.missing": no table public.missing in the source database' in line
    assert pg.execute("SELECT count(*) FROM pg_replication_slots") == [(0,)]  # nothing started


def test_no_source_or_no_tables_is_a_configuration_error(pg: Any, tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[log]\npath = "log"\n')
    r = run_cli("-c", str(path))
    assert r.returncode == 2 and "source: is required for capture" in _one_line_error(r)
    cfg = write_config(tmp_path, pg.dsn, [])
    r = run_cli("-c", str(cfg))
    assert r.returncode == 2 and "tables: no tables configured" in _one_line_error(r)


def test_teardown_drops_the_slot_and_the_publication_of_this_log(
    pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``teardown``: without --yes it says what it would drop (exit 2, nothing dropped), --dry-run lists it (exit 0,
    nothing dropped); refused while a capture streams from the slot (with --log: while it writes the log); then the
    slot, this log's publication and with --log the log go, another log's publication stays."""
    import threading

    from mirrorline import config as C
    from mirrorline.capture.session import Capture
    from mirrorline.cli.main import main

    pg.execute("CREATE TABLE a (id int PRIMARY KEY); INSERT INTO a VALUES (1)")
    cfg = write_config(tmp_path, pg.dsn, ["public.a"])
    Capture(C.load(cfg), once=True).run()
    slots = "SELECT slot_name FROM pg_replication_slots"
    pubs = "SELECT pubname FROM pg_publication ORDER BY 1"
    assert main(["teardown", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "drop the replication slot mirrorline" in err and "drop the publication mirrorline" in err
    assert pg.execute(slots) == [("mirrorline",)]
    assert main(["teardown", "--dry-run", "--log", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "would drop the replication slot mirrorline" in out and "would remove the change log at" in out, out
    log_root = C.load(cfg).log.path
    assert pg.execute(slots) == [("mirrorline",)] and Path(log_root).is_dir()
    ready = threading.Event()
    cap = Capture(C.load(cfg), on_ready=lambda _s: ready.set())
    th = threading.Thread(target=cap.run, daemon=True)
    th.start()
    try:
        assert ready.wait(60)
        assert main(["teardown", "--yes", "-c", str(cfg)]) == 3
        assert "is in use by the process" in capsys.readouterr().err
        assert main(["teardown", "--yes", "--log", "-c", str(cfg)]) == 3
        assert "is being written by the process" in capsys.readouterr().err
    finally:
        cap.stop()
        th.join(30)
    other = connect(pg.dsn)
    try:
        reconcile_publication(other, "theirs", ["public.a"], "/elsewhere")
    finally:
        other.close()
    wait_until(  # (the walsender lets go of the slot later)
        lambda: main(["teardown", "--yes", "--log", "-c", str(cfg)]) == 0,
        timeout=30,
        interval=0.5,
        what="teardown drops the slot",
    )
    out = capsys.readouterr().out
    assert "dropped the replication slot mirrorline" in out and "dropped the publication mirrorline" in out
    assert "removed the change log at" in out and not Path(log_root).exists()
    assert pg.execute(slots) == [] and pg.execute(pubs) == [("theirs",)]
    assert main(["teardown", "-c", str(cfg)]) == 0
    assert "nothing to tear down" in capsys.readouterr().out


def test_failover_needs_postgresql_17(pg: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``[source] failover = true`` on a server without failover slots (this machine's PostgreSQL 15): capture and a
    snapshot each refuse in one line, before any slot or publication is made."""
    from mirrorline.cli.main import main

    pg.execute("CREATE TABLE a (id int PRIMARY KEY)")
    cfg = configs.write(
        tmp_path / "mirrorline.toml",
        source={"dsn": pg.dsn, "failover": True},
        log="log",
        tables=["public.a"],
        targets={"t": "sqlite:///t.db"},
    )
    for args in (["capture", "--once"], ["snapshot", "--target", "t"]):
        assert main([*args, "-c", str(cfg)]) == 3
        err = capsys.readouterr().err
        assert "failover = true needs PostgreSQL 17 or later (the source runs 15)" in err, err
        assert "Traceback" not in err
    assert pg.execute("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()") == []
    assert pg.execute("SELECT pubname FROM pg_publication") == []
