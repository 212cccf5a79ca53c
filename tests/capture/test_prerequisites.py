"""What the source must give mirrorline's role, checked at start: each missing thing named with the statement that
gives it, nothing created at the source before it is given; the statements themselves run and make the start work."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import configs
import pytest

from mirrorline.capture.prerequisites import Facts, findings
from mirrorline.cli.main import main

# ----------------------------------------------------------------------------------------------------- pure core


def test_a_ready_source_has_no_findings() -> None:
    assert findings(Facts(role="r")) == []


def test_each_missing_thing_names_its_statement() -> None:
    facts = Facts(
        role='repl "user"',
        version=130000,
        wal_level="replica",
        may_replicate=False,
        unusable_schemas=("My Schema",),
        unreadable=('My Schema.Order "Items"',),
        publication="pub",
        unpublished=('My Schema.Order "Items"', "public.t"),
        publication_exists=False,
        not_owned=('My Schema.Order "Items"',),
        slot_exists=False,
        slots_used=10,
        max_slots=10,
        senders_used=3,
    )
    found = findings(facts)
    assert all(f.blocking for f in found)
    statements = [f.statement for f in found]
    assert "needs 14 or newer" in found[0].what
    assert statements[1].startswith("ALTER SYSTEM SET wal_level = logical;")
    assert statements[2] == 'ALTER ROLE "repl ""user""" WITH REPLICATION;'
    assert statements[3] == 'GRANT USAGE ON SCHEMA "My Schema" TO "repl ""user""";'
    assert statements[4] == 'GRANT SELECT ON "My Schema"."Order ""Items""" TO "repl ""user""";'
    assert statements[5] == (
        'CREATE PUBLICATION "pub" FOR TABLE "My Schema"."Order ""Items""", "public"."t" '
        "WITH (publish_via_partition_root = true);"
    )
    assert statements[6].startswith("ALTER SYSTEM SET max_replication_slots = 12;")
    assert len(found) == 7  # WAL senders: 3 of 10 in use


def test_amazon_rds_grants_replication_through_its_role() -> None:
    (f,) = findings(Facts(role="app", may_replicate=False, rds=True))
    assert f.statement == 'GRANT rds_replication TO "app";'


def test_an_existing_slot_needs_no_room_and_an_existing_publication_is_altered() -> None:
    full = Facts(role="r", slot_exists=True, slots_used=10, max_slots=10, senders_used=10, max_senders=10)
    assert findings(full) == []
    (f,) = findings(Facts(role="r", unpublished=("public.t",), not_owned=("public.t",), publication="p"))
    assert f.statement == 'ALTER PUBLICATION "p" ADD TABLE "public"."t";'


def test_unbounded_wal_kept_by_the_slot_is_advice_not_a_stop() -> None:
    (f,) = findings(Facts(role="r", wal_keep="-1"))
    assert not f.blocking and "max_slot_wal_keep_size" in f.statement


# ------------------------------------------------------------------------------------------- a real source


def _config(tmp_path: Path, pg: Any, role: str, *, publication: str = "mirrorline") -> Path:
    dsn = f"{pg.dsn.replace('user=postgres', '')} user='{role}'"
    source: dict[str, Any] = {"dsn": dsn, "slot": "s_" + uuid.uuid4().hex[:8], "publication": publication}
    p = tmp_path / "m.toml"
    configs.write(p, source=source, log=tmp_path / "log", tables=['My Schema."Order Items"'])
    return p


def _statements(err: str) -> list[str]:
    return [line.strip() for line in err.splitlines() if line.startswith("      ")]


@pytest.fixture
def role(pg: Any) -> Any:
    name = f"repl user {uuid.uuid4().hex[:6]}"
    quoted = '"' + name + '"'
    pg.execute(f"CREATE ROLE {quoted} LOGIN")
    yield name
    pg.execute(f"DROP OWNED BY {quoted}; DROP ROLE {quoted}")


def test_start_names_each_missing_right_and_the_statements_make_it_start(
    tmp_path: Path, pg: Any, role: str, capsys: Any
) -> None:
    pg.execute(
        'CREATE SCHEMA "My Schema"; CREATE TABLE "My Schema"."Order Items" (id int PRIMARY KEY, note text);'
        'INSERT INTO "My Schema"."Order Items" VALUES (1, \'a\')'
    )
    cfg = _config(tmp_path, pg, role)
    assert main(["capture", "--once", "-c", str(cfg)]) == 3
    err = capsys.readouterr().err
    assert "the source is not ready for replication (4 missing" in err
    statements = _statements(err)
    assert statements == [
        f'ALTER ROLE "{role}" WITH REPLICATION;',
        f'GRANT USAGE ON SCHEMA "My Schema" TO "{role}";',
        f'GRANT SELECT ON "My Schema"."Order Items" TO "{role}";',
        'CREATE PUBLICATION "mirrorline" FOR TABLE "My Schema"."Order Items" WITH (publish_via_partition_root = true);',
    ]
    # nothing was created at the source, and the log holds no position
    assert pg.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()") == [(0,)]
    assert pg.execute("SELECT count(*) FROM pg_publication") == [(0,)]
    assert not list((tmp_path / "log").rglob("*.parquet"))

    # a table's owner (here the superuser) runs what it said: the start goes through, the publication used as made
    for statement in statements:
        pg.execute(statement)
    assert main(["capture", "--once", "-c", str(cfg)]) == 0
    assert pg.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()") == [(1,)]
    pg.execute('UPDATE "My Schema"."Order Items" SET note = \'b\'')
    assert main(["capture", "--once", "-c", str(cfg)]) == 0
    assert "not ready" not in capsys.readouterr().err


def test_a_role_that_owns_its_tables_needs_only_to_replicate(tmp_path: Path, pg: Any, role: str, capsys: Any) -> None:
    pg.execute(
        f'CREATE SCHEMA "My Schema" AUTHORIZATION "{role}"; '
        'CREATE TABLE "My Schema"."Order Items" (id int PRIMARY KEY, note text); '
        f'ALTER TABLE "My Schema"."Order Items" OWNER TO "{role}"'
    )
    cfg = _config(tmp_path, pg, role, publication="its own")
    assert main(["capture", "--once", "-c", str(cfg)]) == 3
    statements = _statements(capsys.readouterr().err)
    assert statements == [
        f'ALTER ROLE "{role}" WITH REPLICATION;',
        f'GRANT CREATE ON DATABASE "{pg.name}" TO "{role}";',
    ]
    for statement in statements:
        pg.execute(statement)
    assert main(["capture", "--once", "-c", str(cfg)]) == 0
    assert pg.execute("SELECT pubname FROM pg_publication") == [("its own",)]


def test_a_full_set_of_slots_is_named_before_anything_is_made(
    pg_cluster_factory: Any, tmp_path: Path, capsys: Any, caplog: Any
) -> None:
    cluster = pg_cluster_factory(max_replication_slots="1", max_slot_wal_keep_size="-1")
    cluster.execute("CREATE TABLE t (id int PRIMARY KEY)")
    cluster.execute("SELECT pg_create_logical_replication_slot('someone_else', 'pgoutput')")
    p = tmp_path / "m.toml"
    configs.write(p, source=cluster.dsn(), log=tmp_path / "log", tables=["public.t"])
    assert main(["capture", "--once", "-c", str(p)]) == 3
    err = capsys.readouterr().err
    assert "every replication slot is in use (1 of max_replication_slots = 1)" in err
    assert "ALTER SYSTEM SET max_replication_slots = 3;" in err
    assert "max_slot_wal_keep_size is unbounded" in caplog.text  # the advice, logged beside the stop
    assert cluster.execute("SELECT count(*) FROM pg_publication") == [(0,)]


def test_a_publication_made_by_an_administrator_is_used_as_made(
    tmp_path: Path, pg: Any, role: str, capsys: Any
) -> None:
    """Part of a table, a role that owns nothing: the statements the start names, run by the owner, give a
    publication the role uses at every start without changing it; a table configured later is named the same way."""
    pg.execute(
        "CREATE TABLE public.accounts (id int PRIMARY KEY, secret text, region text);"
        "INSERT INTO public.accounts VALUES (1, 's', 'eu'), (2, 't', 'us');"
        "CREATE TABLE public.more (id int PRIMARY KEY);"
        f'ALTER ROLE "{role}" WITH REPLICATION; GRANT SELECT (id, region) ON public.accounts TO "{role}"'
    )
    dsn = f"{pg.dsn.replace('user=postgres', '')} user='{role}'"
    source = {"dsn": dsn, "slot": "s_" + uuid.uuid4().hex[:8], "publication": "Admin Made"}
    cfg = tmp_path / "m.toml"
    accounts = {"columns": ["id", "region"]}
    configs.write(cfg, source=source, log=tmp_path / "log", tables={"public.accounts": accounts})
    assert main(["capture", "--once", "-c", str(cfg)]) == 3
    (statement,) = _statements(capsys.readouterr().err)
    assert statement == (
        'CREATE PUBLICATION "Admin Made" FOR TABLE "public"."accounts" ("id", "region") '
        "WITH (publish_via_partition_root = true);"
    )
    pg.execute(statement)
    for _ in range(2):  # the first start and a restart: the publication is not changed
        assert main(["capture", "--once", "-c", str(cfg)]) == 0, capsys.readouterr().err
        pg.execute("UPDATE public.accounts SET region = 'uk' WHERE id = 2")
    assert pg.execute("SELECT obj_description(oid, 'pg_publication') FROM pg_publication") == [(None,)]

    configs.write(cfg, source=source, log=tmp_path / "log", tables={"public.accounts": accounts, "public.more": {}})
    pg.execute(f'GRANT SELECT ON public.more TO "{role}"')
    assert main(["capture", "--once", "-c", str(cfg)]) == 3
    assert _statements(capsys.readouterr().err) == ['ALTER PUBLICATION "Admin Made" ADD TABLE "public"."more";']
    pg.execute('ALTER PUBLICATION "Admin Made" ADD TABLE "public"."more"')
    assert main(["capture", "--once", "-c", str(cfg)]) == 0, capsys.readouterr().err


def test_a_server_without_logical_decoding_is_named_with_the_setting(
    pg_cluster_factory: Any, tmp_path: Path, capsys: Any
) -> None:
    cluster = pg_cluster_factory(wal_level="replica", max_wal_senders="10")
    cluster.execute("CREATE TABLE t (id int PRIMARY KEY)")
    p = tmp_path / "m.toml"
    configs.write(p, source=cluster.dsn(), log=tmp_path / "log", tables=["public.t"])
    assert main(["capture", "--once", "-c", str(p)]) == 3
    err = capsys.readouterr().err
    assert "wal_level is replica; logical decoding needs wal_level = logical" in err
    assert _statements(err)[0].startswith("ALTER SYSTEM SET wal_level = logical;")
