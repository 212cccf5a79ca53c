"""The tests' own helpers (tests/support): the configuration builder writes what mirrorline reads back, however the
names are spelled; ``wait_until`` returns what it waited for, or fails naming it and what it last saw."""

from __future__ import annotations

import tomllib
from pathlib import Path

import configs
import pytest
from waiting import wait_until


def test_the_builder_quotes_names_and_strings_as_toml_wants(tmp_path: Path) -> None:
    dsn = "host=127.0.0.1 port=1 dbname=x password='a \"b\" \\c'"
    conf = configs.load(
        tmp_path / "m.toml",
        source={"dsn": dsn, "slot": "s1"},
        log={"path": tmp_path / "log", "segment_changes": 500, "segment_seconds": "200ms"},
        apply={"latency": "100ms", "max_changes": 40, "threads": 2},
        tables={
            'sales."Order Items"': {"key": ["id"], "where": "region IN ('eu', 'uk')\tAND id > 0"},
            "public.with space": {"actions": "I", "sequence": 2},
            "public.zzz": {"columns": {"a": "text", "b b": "text"}, "key": ["a"]},
        },
        targets={
            "cache": "sqlite:///cache.db",
            "lake-1": {"url": "delta:///lake", "mode": "mirror", "all_or_nothing": True, "compact_every": "1h"},
        },
        spark={"conf": {"spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False}},
        metrics={"listen": "127.0.0.1:9187"},
    )
    assert conf.source is not None and (conf.source.dsn, conf.source.slot) == (dsn, "s1")
    assert (conf.log.path, conf.log.segment_changes, conf.log.segment_seconds) == (tmp_path / "log", 500, 0.2)
    assert (conf.apply.latency, conf.apply.max_changes, conf.apply.threads) == (0.1, 40, 2)
    assert sorted(conf.tables) == ["public.with space", "public.zzz", "sales.Order Items"]
    assert conf.tables["sales.Order Items"].where == "region IN ('eu', 'uk')\tAND id > 0"
    assert conf.tables["public.with space"].actions == frozenset("I") and conf.tables["public.with space"].sequence == 2
    assert conf.tables["public.zzz"].columns == {"a": "text", "b b": "text"}
    assert conf.targets["cache"].location == str(tmp_path / "cache.db")
    lake = conf.targets["lake-1"]
    assert (lake.kind, lake.mode, lake.all_or_nothing, lake.compact_every) == ("delta", "mirror", True, 3600.0)
    assert conf.spark.conf == {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
    assert conf.metrics.listen == ("127.0.0.1", 9187)


def test_the_builder_writes_only_the_sections_given(tmp_path: Path) -> None:
    text = configs.text(source="postgresql://x@h/db", log="log", apply={}, tables=["public.t"], targets={"t": "u"})
    assert text.splitlines() == [
        "[source]",
        'dsn = "postgresql://x@h/db"',
        "[log]",
        'path = "log"',
        '[tables."public.t"]',
        "[targets.t]",
        'url = "u"',
    ]
    assert tomllib.loads(configs.text(tables=["a.b", "c.d"])) == {"tables": {"a.b": {}, "c.d": {}}}
    odd = "\n\x01\x7f\\"
    assert tomllib.loads(configs.text(log={"path": "l", "x": odd})) == {"log": {"path": "l", "x": odd}}
    assert configs.text() == "\n"


def test_wait_until_returns_the_value_it_waited_for() -> None:
    seen = iter([0, None, "", [], 7])
    assert wait_until(lambda: next(seen), timeout=5, interval=0.001, what="a value comes") == 7


def test_wait_until_names_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting until the queue is full \(last value: \[\]\)\nthe log's tail"):
        wait_until(lambda: [], timeout=0.05, interval=0.01, what="the queue is full", context=lambda: "the log's tail")


def test_wait_until_lets_what_the_predicate_raises_through() -> None:
    def dead() -> bool:
        raise AssertionError("the process died")

    with pytest.raises(AssertionError, match="the process died"):
        wait_until(dead, timeout=60, what="never")
