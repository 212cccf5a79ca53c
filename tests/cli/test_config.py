from __future__ import annotations

from pathlib import Path

import pytest

from mirrorline import config
from mirrorline.config.values import parse_duration
from mirrorline.errors import ConfigError

FULL = """
[source]
dsn = "postgresql://app:s3cret@db.example:5432/app"
slot = "mirrorline"

[log]
path = "./mirrorline-log"

[apply]
latency = "2s"
max_changes = 1000000
threads = "2:45:3"

[tables."public.orders"]
actions = "IDU"
sequence = 1
key = ["id"]

[tables."public.items"]
actions = "iu"

[tables."public.notes"]
sequence = -5

[targets.cache]
url = "sqlite:///cache.db"
[targets.warehouse]
url = "postgresql://dw@warehouse.example/dw"
mode = "mirror"
[targets.lake]
url = "duckdb:////var/lib/lake.duckdb"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "mirrorline.toml"
    p.write_text(text)
    return p


def test_the_design_example_loads(tmp_path):
    cfg = config.load(write(tmp_path, FULL))
    assert cfg.source is not None and cfg.source.slot == "mirrorline" and cfg.source.publication == "mirrorline"
    assert cfg.log.path == tmp_path / "mirrorline-log"
    assert (cfg.apply.threads, cfg.apply.latency, cfg.apply.builders) == (2, 2.0, 3)  # explicit latency wins
    assert cfg.apply.max_changes == 1_000_000
    assert cfg.tables["public.orders"].key == ("id",)
    assert cfg.tables["public.items"].actions == frozenset("IU")
    assert cfg.tables["public.notes"].sequence == -1
    assert cfg.targets["cache"].kind == "sqlite"
    assert cfg.targets["cache"].location == str(tmp_path.resolve() / "cache.db")
    assert cfg.targets["lake"].location == "/var/lib/lake.duckdb"
    assert cfg.targets["warehouse"].mode == "mirror" and cfg.targets["warehouse"].kind == "postgresql"


def test_tables_load_in_sequence_order_negatives_first(tmp_path):
    cfg = config.load(write(tmp_path, FULL))
    assert [t.name for t in cfg.tables_in_load_order()] == ["public.items", "public.notes", "public.orders"]


@pytest.mark.parametrize(
    ("form", "expected"),
    [("1::1", (1, 2.0, 1)), ("::2", (1, 2.0, 2)), ("3:", (3, 2.0, 1)), (":10", (1, 10.0, 1)), ("4::", (4, 2.0, 1))],
)
def test_empty_fields_of_the_threads_form_are_defaults(tmp_path, form, expected):
    # seed 003 writes "1::1": threads 1, the default latency, builders 1 (builders is accepted and does nothing:
    # the compile's parallelism is Spark's)
    cfg = config.load(write(tmp_path, f'[apply]\nthreads = "{form}"\n'))
    assert (cfg.apply.threads, cfg.apply.latency, cfg.apply.builders) == expected


def test_threads_form_gives_latency_and_builders(tmp_path):
    cfg = config.load(write(tmp_path, '[apply]\nthreads = "2:45:3"\n'))
    assert (cfg.apply.threads, cfg.apply.latency, cfg.apply.builders) == (2, 45.0, 3)


def test_explicit_latency_wins_over_the_threads_form(tmp_path):
    cfg = config.load(write(tmp_path, '[apply]\nthreads = "2:45:3"\nlatency = "500ms"\n'))
    assert cfg.apply.latency == 0.5 and cfg.apply.threads == 2


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ('[apply]\nlatency = "soon"\n', "apply.latency", "expected a duration"),
        ("[apply]\nthreads = 0\n", "apply.threads", "at least 1"),
        ('[apply]\nthreads = "2:x"\n', "apply.threads", "threads:latency:builders"),
        ('[apply]\nthreads = "::"\n', "apply.threads", "threads:latency:builders"),
        ('[apply]\nthreads = "0::1"\n', "apply.threads", "at least 1"),
        ('[apply]\nmax_changes = "many"\n', "apply.max_changes", "expected an integer"),
        ('[apply]\non_error = "ignore"\n', "apply.on_error", "expected one of stop, reject"),
        ('[source]\nslot = "x"\n', "source.dsn", "is required"),
        ('[source]\ndsn = "host=x"\nslot = "Bad-Slot"\n', "source.slot", "not a valid slot name"),
        ("[tables.orders]\n", "tables.orders", '"schema.name"'),
        ('[tables."a.b.c"]\n', "tables.a.b.c", "quoted as in SQL"),
        ("[tables.'\"a.b\".c']\n", 'tables."a.b".c', "a schema name holding a dot is not supported"),
        ('[tables."s.t"]\n[tables.\'s."t"\']\n', 'tables.s."t"', "names the table s.t a second time"),
        ('[targets.x]\nurl = "sqlite:///x.db"\nall_or_nothing = "yes"\n', "targets.x.all_or_nothing", "boolean"),
        ('[tables."public.t"]\nactions = "IX"\n', 'tables."public.t".actions', "letters among I, D and U"),
        ('[tables."public.t"]\nsequence = "1"\n', 'tables."public.t".sequence', "expected an integer"),
        ('[tables."public.t"]\nkey = ["a", "a"]\n', 'tables."public.t".key', "twice"),
        ('[tables."public.t"]\nkeys = ["a"]\n', 'tables."public.t".keys', "unknown key"),
        ('[targets.x]\nurl = "mysql://h/db"\n', "targets.x.url", "unknown target kind"),
        ('[targets.x]\nurl = "sqlite:/rel.db"\n', "targets.x.url", "sqlite:///relative/path"),
        ('[targets.x]\nurl = "parquet:///lake"\n', "targets.x.url", "there is no parquet target kind"),
        ('[spark]\nmaster = "cluster"\n', "spark.master", "not a Spark master URL"),
        ('[spark]\nmasters = "local"\n', "spark.masters", "unknown key"),
        ('[spark.conf]\n"executor.memory" = "1g"\n', "spark.conf.executor.memory", "spark.*"),
        ('[spark.conf]\n"spark.x" = [1]\n', "spark.conf.spark.x", "string, number or boolean"),
        ('[spark]\npython = ""\n', "spark.python", "is empty"),
        ('[log]\npath = "hdfs://nn:8020/ml"\n', "log.path", "no Hadoop filesystem client"),
        ('[log]\npath = "s3a://bucket/ml"\n', "log.path", "no atomic rename"),
        ('[log]\npath = "file://relative"\n', "log.path", "file:///absolute/path"),
        ('[spark]\nscratch = "gs://b/x"\n', "spark.scratch", "no atomic rename"),
        ('[targets.x]\nurl = "sqlite:///x.db"\nmode = "merge"\n', "targets.x.mode", "update, mirror"),
        ("[targets.x]\n", "targets.x.url", "is required"),
        ("[sources]\n", "sources", "unknown key"),
    ],
)
def test_bad_configuration_names_file_key_and_reason(tmp_path, text, key, reason):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert e.value.key == key
    assert reason in str(e.value)
    assert str(e.value).startswith(f"{p}: {key}: ")
    assert e.value.exit_code == 2


def test_missing_file_and_invalid_toml_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        config.load(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(write(tmp_path, "[source\n"))


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("host=db user=app password=s3cret dbname=app", "host=db user=app password=*** dbname=app"),
        ("host=db password='s3 cret' dbname=app", "host=db password=*** dbname=app"),
        ("postgresql://db/app?user=a&password=s3cret", "postgresql://db/app?user=a&password=***"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
    ],
)
def test_passwords_are_redacted(dsn, shown):
    assert config.redact_dsn(dsn) == shown
    assert "s3cret" not in config.redact_dsn(dsn)


@pytest.mark.parametrize(("value", "seconds"), [("2s", 2.0), ("500ms", 0.5), ("1m", 60.0), (3, 3.0), ("1.5", 1.5)])
def test_durations(value, seconds):
    assert parse_duration(value) == seconds


def test_spark_section(tmp_path):
    cfg = config.load(write(tmp_path, ""))
    assert cfg.spark.master is None and cfg.spark.local and cfg.spark.scratch is None
    assert cfg.spark.master_or_default().startswith("local[")
    text = (
        '[log]\npath = "file:///shared/ml-log"\n'
        '[spark]\nmaster = "spark://10.0.0.5:7077"\npython = "/opt/ml/bin/python"\n'
        '[spark.conf]\n"spark.executor.memory" = "4g"\n"spark.cores.max" = 8\n"spark.speculation" = false\n'
    )
    cfg = config.load(write(tmp_path, text))
    assert cfg.log.path == Path("/shared/ml-log") and not cfg.spark.local
    assert cfg.spark.conf == {"spark.executor.memory": "4g", "spark.cores.max": "8", "spark.speculation": "false"}
    assert cfg.spark.python == "/opt/ml/bin/python"
    assert cfg.spark.scratch == Path("/shared/ml-log/scratch")  # where executors and the driver both reach
    cfg = config.load(write(tmp_path, '[spark]\nmaster = "local[1]"\nscratch = "file:///fast/tmp"\n'))
    assert cfg.spark.local and cfg.spark.scratch == Path("/fast/tmp")


def test_configured_spark_settings_reach_the_session_builder(tmp_path, monkeypatch):
    from mirrorline import scratch, sparkenv

    cfg = config.load(
        write(tmp_path, '[spark]\nmaster = "local[1]"\nscratch = "sc"\n[spark.conf]\n"spark.x.y" = "z"\n')
    )
    monkeypatch.setattr(sparkenv, "_configured", None)
    monkeypatch.setattr(scratch, "_base", None)
    sparkenv.configure(cfg.spark)
    assert sparkenv.master() == "local[1]" and scratch.base() == tmp_path / "sc"


@pytest.mark.parametrize(
    ("written", "name"),
    [
        ("public.orders", "public.orders"),
        ("sales.Order Items", "sales.Order Items"),
        ('sales."Order Items"', "sales.Order Items"),
        ('"Sales"."a.b"', "Sales.a.b"),
        ('"x""y".z', 'x"y.z'),
        ("Odd.MixedCase", "Odd.MixedCase"),
    ],
)
def test_table_names_with_spaces_quotes_and_dots(tmp_path, written, name):
    key = "'" + written + "'"
    p = write(tmp_path, f"[tables.{key}]\n")
    assert list(config.load(p).tables) == [name]


def test_secrets_come_from_the_environment_and_are_never_shown(tmp_path, monkeypatch):
    """``${NAME}`` in the source's DSN and a target's URL is read from the environment when the file is read (a
    password kept out of the file); the target's URL as written stays what is shown, and status names a target it
    cannot reach without the secret."""
    from mirrorline.status import status

    monkeypatch.setenv("ML_TEST_SOURCE_PW", "s0urce-secret")
    monkeypatch.setenv("ML_TEST_TARGET_PW", "t4rget-secret")
    f = tmp_path / "m.toml"
    f.write_text(
        '[source]\ndsn = "host=127.0.0.1 port=1 user=me password=${ML_TEST_SOURCE_PW} dbname=src"\n'
        f'[log]\npath = "{tmp_path / "log"}"\n'
        '[targets.dw]\nurl = "postgresql://dw:${ML_TEST_TARGET_PW}@127.0.0.1:1/dw"\n'
    )
    conf = config.load(f)
    assert conf.source is not None and "password=s0urce-secret" in conf.source.dsn
    dw = conf.targets["dw"]
    assert dw.location == "postgresql://dw:t4rget-secret@127.0.0.1:1/dw"
    assert dw.url == "postgresql://dw:${ML_TEST_TARGET_PW}@127.0.0.1:1/dw"
    assert "secret" not in repr(conf.targets) and "secret" not in config.redact_dsn(conf.source.dsn)
    st = status(conf)
    shown = st.text() + str(st.to_json())
    assert "dw" in shown and "secret" not in shown
    monkeypatch.delenv("ML_TEST_TARGET_PW")
    with pytest.raises(ConfigError, match=r"targets\.dw\.url: the environment variable ML_TEST_TARGET_PW is not set"):
        config.load(f)
