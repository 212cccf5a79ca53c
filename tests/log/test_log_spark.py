"""The Spark reader returns exactly what the Python reader returns, in the log row layout."""

from __future__ import annotations

import pytest

from mirrorline.errors import LogError
from mirrorline.log import ChangeLog, LogWriter, read_spark, retain, set_applied
from mirrorline.log.rows import change_to_row
from mirrorline.model import Change, Op
from mirrorline.position import ZERO, Position

pytestmark = pytest.mark.spark


def varied(i: int) -> Change:
    ops = (Op.INSERT, Op.UPDATE, Op.DELETE, Op.UPDATE)
    op = ops[i % 4]
    if op is Op.DELETE:
        return Change(ZERO, 0, i, "public.t", op, (str(i),))
    unchanged = frozenset({"doc"}) if i % 8 == 1 else frozenset()
    new = {"id": str(i), "note": None if i % 5 == 0 else f"n{i}\t"}
    return Change(
        ZERO,
        0,
        i,
        "s.u" if i % 3 == 0 else "public.t",
        op,
        (str(i),),
        new,
        unchanged,
        ("x",) if i % 8 == 3 else None,
        1 + i % 2,
    )


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> ChangeLog:
    root = tmp_path_factory.mktemp("sparklog")
    n = 0
    with LogWriter(root, segment_changes=20) as w:
        for k in range(1, 13):
            rows = [varied(n + i) for i in range(7)]
            n += 7
            if k in (4, 9):
                s = w.open_stream(k)
                s.add(k, rows[:3])
                s.add(k + 100, rows[3:5])
                s.end_block()
                s.add(k, rows[5:])
                s.commit(k * 100, k * 1_000_000)
            else:
                w.add_transaction(k * 100, k * 1_000_000, rows)
    return ChangeLog(root)


def as_rows(df) -> list[dict]:
    out = []
    for r in df.orderBy("lsn", "seq").collect():
        d = r.asDict(recursive=True)
        d["new"] = sorted(d["new"].items()) if d["new"] is not None else None
        out.append(d)
    return out


def expected(log: ChangeLog, after, upto) -> list[dict]:
    out = []
    for c in log.read(after, upto):
        d = change_to_row(c)
        d["new"] = sorted(d["new"]) if d["new"] is not None else None
        out.append(d)
    return out


@pytest.mark.parametrize(
    ("after", "upto"),
    [
        (None, None),
        (Position(100, 3), Position(400, 4)),
        (Position(400, 1), Position(900, 5)),
        (Position(1200, 6), None),
        (ZERO, Position(300, 6)),
    ],
)
def test_spark_equals_python(spark, log, after, upto):
    df = read_spark(log, after, upto, spark=spark)
    assert df.columns == [
        "lsn",
        "seq",
        "ts",
        "xid",
        "table",
        "op",
        "key",
        "old_key",
        "new",
        "unchanged",
        "schema_version",
    ]
    types = dict(df.dtypes)
    assert types["lsn"] == "bigint" and types["new"] == "map<string,string>" and types["key"] == "array<string>"
    assert types["schema_version"] == "int"
    assert as_rows(df) == expected(log, after, upto)


def test_spark_reads_only_the_segments_it_needs(spark, log):
    df = read_spark(log, Position(1000, 6), Position(1100, 6), spark=spark)
    files = df.inputFiles()
    name = "00000000000003E8-00000000000004B0.parquet"  # transactions 1000, 1100, 1200
    assert [s.name for s in log.select(Position(1000, 6), Position(1100, 6))] == [name]
    assert len(files) == 1 and files[0].endswith(name)


def test_spark_reader_refuses_positions_no_longer_retained(spark, tmp_path):
    with LogWriter(tmp_path, segment_changes=1) as w:
        for k in range(1, 4):
            w.add_transaction(k, k, [varied(k)])
    log = ChangeLog(tmp_path)
    set_applied(log, "t", Position(2, 0))
    retain(log)
    assert read_spark(log, Position(2, 0), spark=spark).count() == 1
    with pytest.raises(LogError, match="no longer retained"):
        read_spark(log, Position(1, 0), spark=spark)
