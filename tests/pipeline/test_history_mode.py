"""History mode (``history = "versions"``): a generated history of inserts, updates (some leaving a TOASTed column
unsent), key changes, deletes, re-inserts and TRUNCATEs across many transactions and units, applied to each SQL kind,
gives the versions a reference of the test's own derives from the same transactions; read back with the kinds' own
clients."""

from __future__ import annotations

import random
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import oracle
import pytest

from mirrorline.config import parse
from mirrorline.errors import ConfigError
from mirrorline.log import LogWriter
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.pipeline import Applier
from mirrorline.position import ZERO

KINDS = ("sqlite", "duckdb", "postgresql", "delta", "iceberg")
T = "public.t"
SCHEMA = TableSchema(T, (Column("id", "bigint", nullable=False), Column("v", "text"), Column("big", "text")), ("id",))
BASE_TS = 1_700_000_000_000_000


Version = tuple[int, str | None, str | None, int, int | None, bool, int, int | None]  # id, v, big, start, end, ...


Soft = dict[int, tuple[str | None, str | None, bool, int | None]]  # id -> v, big, deleted, deleted lsn


def _history(seed: int, txns: int) -> tuple[list[tuple[int, int, list[Change]]], list[Version], Soft]:
    """Transactions ``(commit_lsn, commit_ts, changes)``, the versions they make and the rows soft deletes keep, by
    the test's own rules: after each transaction, every key it touched has its open version closed (deleted when the
    row is not there) and a new one opened when the row is there; a key's last image stays, marked deleted by the
    transaction after which it was not there."""
    rnd = random.Random(seed)
    rows: dict[int, tuple[str | None, str]] = {}
    open_: dict[int, list[Any]] = {}
    done: list[Version] = []
    soft: Soft = {}
    out = []
    for i in range(txns):
        lsn, ts = 1000 + 100 * i, BASE_TS + 1_000_000 * i
        before = dict(rows)
        touched: set[int] = set()
        changes: list[Change] = []
        for _ in range(rnd.randint(1, 4)):
            r = rnd.random()
            present = sorted(rows)
            absent = [k for k in range(1, 9) if k not in rows]
            if r < 0.05:
                changes.append(Change(ZERO, 0, 1, T, Op.TRUNCATE))
                touched |= set(rows)
                rows.clear()
            elif (r < 0.35 or not present) and absent:
                k = rnd.choice(absent)
                v, big = f"v{i}", f"B{k}.{i}"
                rows[k] = (v, big)
                changes.append(Change(ZERO, 0, 1, T, Op.INSERT, (str(k),), {"id": str(k), "v": v, "big": big}))
                touched.add(k)
            elif r < 0.7 and present:
                k = rnd.choice(present)
                v = f"u{i}" if rnd.random() < 0.8 else None
                if rnd.random() < 0.5:  # the TOASTed column not sent
                    rows[k] = (v, rows[k][1])
                    changes.append(
                        Change(ZERO, 0, 1, T, Op.UPDATE, (str(k),), {"id": str(k), "v": v}, frozenset({"big"}))
                    )
                else:
                    rows[k] = (v, f"B{k}.{i}")
                    changes.append(
                        Change(ZERO, 0, 1, T, Op.UPDATE, (str(k),), {"id": str(k), "v": v, "big": rows[k][1]})
                    )
                touched.add(k)
            elif r < 0.85 and present and absent:  # a key change, the TOASTed column not sent
                k, n = rnd.choice(present), rnd.choice(absent)
                v, big = f"m{i}", rows.pop(k)[1]
                rows[n] = (v, big)
                changes.append(
                    Change(
                        ZERO,
                        0,
                        1,
                        T,
                        Op.UPDATE,
                        (str(n),),
                        {"id": str(n), "v": v},
                        frozenset({"big"}),
                        old_key=(str(k),),
                    )
                )
                touched |= {k, n}
            elif present:
                k = rnd.choice(present)
                del rows[k]
                changes.append(Change(ZERO, 0, 1, T, Op.DELETE, (str(k),)))
                touched.add(k)
        for k in sorted(touched):
            if k in open_:
                v0 = open_.pop(k)
                done.append((k, v0[0], v0[1], v0[2], lsn, k not in rows, v0[3], ts))
            if k in rows:
                open_[k] = [rows[k][0], rows[k][1], lsn, ts]
                soft[k] = (rows[k][0], rows[k][1], False, None)
            elif k in soft and not soft[k][2]:
                soft[k] = (soft[k][0], soft[k][1], True, lsn)
        del before
        out.append((lsn, ts, changes))
    for k, v0 in open_.items():
        done.append((k, v0[0], v0[1], v0[2], None, False, v0[3], None))
    return out, sorted(done, key=lambda x: (x[0], x[3])), soft


def _micros(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, str):
        v = datetime.fromisoformat(v)
    if v.tzinfo is None:
        v = v.replace(tzinfo=UTC)
    return int(v.timestamp() * 1_000_000)


def _url_and_reader(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Any]:
    """The target's URL and a reader of its table t (``names``: the columns), by the kind's own client."""
    if kind == "postgresql":
        url = request.getfixturevalue("pg").url
    else:
        suffix = {"sqlite": ".db", "duckdb": ".duckdb", "delta": ".lake", "iceberg": ".ice"}[kind]
        url = f"{kind}:///{tmp_path / ('t' + suffix)}"

    def read(names: list[str]) -> list[tuple[Any, ...]]:
        got = oracle.read(kind, oracle.location(url), T, names)
        assert got is not None
        return sorted(got, key=lambda r: tuple(-1 if v is None else v for v in r[:1] + r[3:4]))

    return url, read


def _versions(read: Any, prefix: str = "_ml_") -> list[Version]:
    p = prefix
    got = read(["id", "v", "big", f"{p}start_lsn", f"{p}end_lsn", f"{p}deleted", f"{p}start_at", f"{p}end_at"])
    return [(int(r[0]), r[1], r[2], int(r[3]), r[4], bool(r[5]), _micros(r[6]), _micros(r[7])) for r in got]


@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_versions_match_a_reference_of_the_test(
    tmp_path: Path, spark: Any, kind: str, request: pytest.FixtureRequest
) -> None:
    txns, want, _ = _history(seed=7, txns=45)
    with LogWriter(tmp_path / "log") as w:
        w.record_schema(SCHEMA)
        for lsn, ts, changes in txns:
            w.add_transaction(lsn, ts, changes)
    url, read = _url_and_reader(kind, tmp_path, request)
    conf = parse(
        {
            "log": {"path": str(tmp_path / "log")},
            "apply": {"max_changes": 15},
            "tables": {T: {}},
            "targets": {"x": {"url": url, "history": "versions"}},
        },
        tmp_path / "m.toml",
    )
    a = Applier(conf, spark=spark)
    reports = a.catch_up()
    a.close()
    assert len(reports) > 5  # many units
    assert _versions(read) == want
    # the current rows: one documented predicate
    current = sorted((k, v, b) for k, v, b, _, end, *_ in want if end is None)
    assert [r[:3] for r in read(["id", "v", "big", "_ml_end_lsn"]) if r[3] is None] == current
    # a unit applied again adds nothing
    a = Applier(conf, spark=spark)
    assert not [r for r in a.catch_up() if r.results]
    a.close()
    assert _versions(read) == want


@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_soft_deletes_match_a_reference_of_the_test(
    tmp_path: Path, spark: Any, kind: str, request: pytest.FixtureRequest
) -> None:
    txns, _, want = _history(seed=11, txns=45)
    with LogWriter(tmp_path / "log") as w:
        w.record_schema(SCHEMA)
        for lsn, ts, changes in txns:
            w.add_transaction(lsn, ts, changes)
    url, read = _url_and_reader(kind, tmp_path, request)
    conf = parse(
        {
            "log": {"path": str(tmp_path / "log")},
            "apply": {"max_changes": 15},
            "tables": {T: {"history": "soft_delete", "history_prefix": "meta_"}},
            "targets": {"x": {"url": url}},
        },
        tmp_path / "m.toml",
    )
    a = Applier(conf, spark=spark)
    assert len(a.catch_up()) > 5
    a.close()
    got = read(["id", "v", "big", "meta_deleted", "meta_deleted_lsn", "meta_deleted_at"])
    assert {int(r[0]): (r[1], r[2], bool(r[3]), r[4]) for r in got} == want
    assert any(d for _, _, d, _ in want.values()) and any(not d for _, _, d, _ in want.values())
    assert all((r[4] is None) == (r[5] is None) for r in got)
    assert [r[0] for r in got if not r[3]] == sorted(k for k, (_, _, d, _) in want.items() if not d)


def test_history_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="history: expected one of"):
        parse(
            {"log": {"path": str(tmp_path / "log")}, "targets": {"d": {"url": "delta:///x", "history": "all"}}},
            tmp_path / "m.toml",
        )
    with pytest.raises(ConfigError, match="history_prefix"):
        parse(
            {
                "log": {"path": str(tmp_path / "log")},
                "targets": {"s": {"url": "sqlite:///x.db", "history": "versions", "history_prefix": "1x"}},
            },
            tmp_path / "m.toml",
        )


@pytest.mark.spark
def test_a_refusal_is_named_for_the_table_it_is_in(tmp_path: Path, spark: Any) -> None:
    """A unit of a table kept in versions and a plain one, in one transaction at a SQLite target: a row the plain
    table refuses takes the failure path (set aside with ``on_error = "reject"``) and the versions are written beside
    it; a row the versioned table refuses stops that table, named, while the plain one goes on."""
    from mirrorline.errors import ApplyError

    plain = TableSchema("public.p", SCHEMA.columns, ("id",))
    with LogWriter(tmp_path / "log") as w:
        w.record_schema(SCHEMA)
        w.record_schema(plain)
        w.add_transaction(
            100,
            BASE_TS,
            [
                Change(ZERO, 0, 1, T, Op.INSERT, ("1",), {"id": "1", "v": "a", "big": "b"}),
                Change(ZERO, 0, 1, "public.p", Op.INSERT, ("1",), {"id": "1", "v": "bad", "big": "b"}),
                Change(ZERO, 0, 1, "public.p", Op.INSERT, ("2",), {"id": "2", "v": "ok", "big": "b"}),
            ],
        )
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE p (id INTEGER PRIMARY KEY, v TEXT, big TEXT)")
        c.execute("CREATE TRIGGER no_bad BEFORE INSERT ON p WHEN NEW.v = 'bad' BEGIN SELECT RAISE(ABORT, 'bad'); END")
    conf = parse(
        {
            "log": {"path": str(tmp_path / "log")},
            "tables": {T: {"history": "versions"}, "public.p": {}},
            "targets": {"x": {"url": f"sqlite:///{db}", "on_error": "reject"}},
        },
        tmp_path / "m.toml",
    )
    a = Applier(conf, spark=spark)
    (report,) = [r for r in a.catch_up() if r.results]
    a.close()
    assert report.results["x"].rejects == 1 and report.results["x"].serial == ["public.p"]
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT id, v, _ml_end_lsn FROM t").fetchall() == [(1, "a", None)]
        assert c.execute("SELECT id FROM p").fetchall() == [(2,)]
    # the versioned table refuses the next unit's row: that table stops, named; the plain one goes on
    with LogWriter(tmp_path / "log") as w:
        w.add_transaction(
            200,
            BASE_TS + 1,
            [
                Change(ZERO, 0, 1, T, Op.UPDATE, ("1",), {"id": "1", "v": "bad", "big": "b"}),
                Change(ZERO, 0, 1, "public.p", Op.INSERT, ("3",), {"id": "3", "v": "ok", "big": "b"}),
            ],
        )
    with sqlite3.connect(db) as c:
        c.execute("CREATE TRIGGER no_bad_t BEFORE INSERT ON t WHEN NEW.v = 'bad' BEGIN SELECT RAISE(ABORT, 'bad'); END")
    a = Applier(conf, spark=spark)
    with pytest.raises(ApplyError, match=r"versions of public\.t") as e:
        a.catch_up()
    a.close()
    assert e.value.context["table"] == T
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT id FROM p ORDER BY id").fetchall() == [(2,), (3,)]
        assert c.execute("SELECT v, _ml_end_lsn FROM t").fetchall() == [("a", None)]
