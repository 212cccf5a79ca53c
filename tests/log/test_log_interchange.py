"""Import of daystream files into the log and export of the log as daystream lines: round trips, atomic import,
positions after the log's end, errors naming file and line, and the `mirrorline log` commands."""

from __future__ import annotations

import io
from pathlib import Path

import configs
import pytest
from daystream_vectors import DAYSTREAM, DELTAFLOOD

from mirrorline.cli.main import main
from mirrorline.config import TableConfig
from mirrorline.errors import DecodeError, LogError
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log.interchange import export_daystream, import_daystream
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.position import ZERO, Position

ZZZ = {"public.zzz": TableConfig("public.zzz", key=("a",), columns={"a": "text", "b": "text"})}


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(ln + "\n" for ln in lines))
    return path


def export(root: Path, **kw) -> list[str]:
    out = io.StringIO()
    export_daystream(ChangeLog(root), out, **kw)
    return out.getvalue().splitlines()


def test_seed_file_imports_and_exports_byte_for_byte(tmp_path):
    seed = write(tmp_path / "seed.ds", DAYSTREAM)
    r = import_daystream(tmp_path / "log", [seed], ZZZ)
    assert (r.files, r.transactions, r.changes) == (1, 16, 18)
    assert (r.first, r.last) == (Position(1, 0), Position(16, 0))
    assert export(tmp_path / "log") == DAYSTREAM
    assert (tmp_path / "log" / "segments").exists()
    schema = ChangeLog(tmp_path / "log").schema("public.zzz", 1)
    assert schema.key == ("a",) and schema.column_names == ("a", "b") and schema.since == Position(1, 0)


def test_plain_deltaflood_lines_import_with_the_import_time(tmp_path):
    r = import_daystream(tmp_path / "log", [write(tmp_path / "d.ds", DELTAFLOOD)], ZZZ)
    assert r.changes == 10
    changes = list(ChangeLog(tmp_path / "log").read())
    assert len({c.commit_ts for c in changes}) == 1 and changes[0].commit_ts > 1_600_000_000_000_000


def test_export_from_a_time_or_a_position(tmp_path):
    import_daystream(tmp_path / "log", [write(tmp_path / "seed.ds", DAYSTREAM)], ZZZ)
    assert export(tmp_path / "log", from_ts=1507507201_000000) == DAYSTREAM[18:]
    assert export(tmp_path / "log", after=Position(14, 0)) == DAYSTREAM[18:]
    # a line keeps its (_c, _s) wherever the export starts
    assert export(tmp_path / "log", after=Position(1, 0), upto=Position(2, 0)) == [DAYSTREAM[1]]


def _addressed_log(root: Path) -> list[str]:
    """A log of small segments whose commit times go back now and then (concurrent commits), with key changes (two
    lines each); its whole export."""
    import random

    rng = random.Random(7)
    ts = 1_700_000_000_000_000
    with LogWriter(root, segment_changes=7) as w:
        for i in range(1, 120):
            ts += rng.choice([-400_000, 0, 150_000, 300_000, 900_000, 2_500_000])
            key = (f"k{i}",)
            c = Change(ZERO, 0, i, "public.zzz", Op.INSERT, key, {"a": key[0], "b": "x"})
            if i % 5 == 0:
                c = Change(ZERO, 0, i, "public.zzz", Op.UPDATE, key, {"a": key[0], "b": "y"}, old_key=(f"o{i}",))
            w.record_schema(TableSchema("public.zzz", (Column("a", "text"), Column("b", "text")), ("a",)))
            w.add_transaction(0x100 + i, ts, [c])
    return export(root)


def _address(line: str) -> tuple[int, int]:
    f = line.split("\t")
    assert f[0] == "_c" and f[2] == "_s"
    return int(f[1]), int(f[3])


def test_every_line_keeps_its_address_wherever_the_export_starts(tmp_path):
    """(_c, _s) is a stable address: _c never goes back, _s counts the lines of a _c from the first; an
    export starting at any change, or right after any line's address, gives each line the address of the whole
    export; the same after retention removed the first segments."""
    root = tmp_path / "log"
    whole = _addressed_log(root)
    addrs = [_address(x) for x in whole]
    assert len(whole) == 119 + 23 and addrs == sorted(addrs) and len(set(addrs)) == len(addrs)
    assert any(a[1] > 0 for a in addrs) and any(a[1] == 0 for a in addrs[1:])
    positions = [c.pos for c in ChangeLog(root).read()]
    line_of = {}  # position -> index of its first line in the whole export
    i = 0
    for c in ChangeLog(root).read():
        line_of[c.pos] = i
        i += 2 if c.old_key is not None else 1
    two = {c.pos for c in ChangeLog(root).read() if c.old_key is not None}
    for p in positions[::3]:
        assert export(root, after=p) == whole[line_of[p] + (2 if p in two else 1) :], p
    for k in range(0, len(whole), 5):
        assert export(root, from_address=addrs[k]) == whole[k + 1 :], addrs[k]

    from mirrorline.log.retention import retain, set_applied

    set_applied(ChangeLog(root), "r", positions[60])  # a reader that applied half the log
    removed = retain(ChangeLog(root))
    assert removed
    kept = [c.pos for c in ChangeLog(root).read()]
    first = line_of[kept[0]]
    assert export(root) == whole[first:]
    assert export(root, after=kept[3]) == whole[line_of[kept[4]] :]
    assert export(root, from_address=addrs[first + 2]) == whole[first + 3 :]
    with pytest.raises(LogError, match="no longer retained"):
        export(root, from_address=addrs[first - 3])


def test_log_to_daystream_to_log_round_trip(tmp_path):
    """Captured changes of every kind (with NULLs, unchanged TOAST, key changes, truncate, escapes, another
    schema) survive export and import; commit times keep their whole seconds."""
    schema = TableSchema("s.t", (Column("id", "bigint"), Column("v", "text"), Column("doc", "jsonb")), ("id",))
    src = tmp_path / "src"
    txns = [
        [
            Change(ZERO, 0, 7, "s.t", Op.INSERT, ("1",), {"id": "1", "v": "a\tb\\c\nd", "doc": None}),
            Change(ZERO, 0, 7, "s.t", Op.INSERT, ("2",), {"id": "2", "v": None, "doc": '{"k": "é"}'}),
        ],
        [Change(ZERO, 0, 8, "s.t", Op.UPDATE, ("1",), {"id": "1", "v": "x"}, frozenset({"doc"}))],
        [
            Change(ZERO, 0, 9, "s.t", Op.UPDATE, ("3",), {"id": "3", "v": "y", "doc": "[]"}, old_key=("2",)),
            Change(ZERO, 0, 9, "s.t", Op.DELETE, ("1",)),
        ],
        [Change(ZERO, 0, 10, "s.t", Op.TRUNCATE)],
    ]
    with LogWriter(src) as w:
        assert w.record_schema(schema).version == 1
        for i, t in enumerate(txns):
            w.add_transaction(0x1000 + i, (1_600_000_000 + i // 2) * 1_000_000, t)
    lines = export(src)
    assert len(lines) == 7
    dst = tmp_path / "dst"
    r = import_daystream(
        dst,
        [write(tmp_path / "x.ds", lines)],
        {"s.t": TableConfig("s.t", key=("id",), columns={"id": "bigint", "v": "text", "doc": "jsonb"})},
    )
    assert r.transactions == 4 and r.changes == 6

    def strip(c: Change) -> tuple:
        return (c.pos.seq, c.commit_ts, c.xid, c.table, c.op, c.key, c.new, c.unchanged, c.old_key)

    assert [strip(c) for c in ChangeLog(dst).read()] == [strip(c) for c in ChangeLog(src).read()]
    assert export(dst) == lines


def test_import_goes_after_the_logs_end_and_keeps_increasing(tmp_path):
    root = tmp_path / "log"
    with LogWriter(root) as w:
        w.add_transaction(0x500, 1, [Change(ZERO, 0, 1, "public.zzz", Op.DELETE, ("q",))])
    a = import_daystream(root, [write(tmp_path / "a.ds", DAYSTREAM[:2])], ZZZ)
    b = import_daystream(root, [write(tmp_path / "b.ds", DAYSTREAM[2:4])], ZZZ)
    assert a.first == Position(0x501, 0) and a.last == Position(0x502, 0)
    assert b.first == Position(0x503, 0) and b.last == Position(0x504, 0)
    pos = [c.pos for c in ChangeLog(root).read()]
    assert pos == sorted(pos) and len(pos) == 5


def test_lines_imported_before_are_skipped(tmp_path):
    """A host that sends again what it sent before (seed 002's restart where it left off, with some overlap): lines
    whose (_c, _s) address is not beyond the highest imported are skipped, also once retention removed the segment
    that recorded it; lines without an address are always imported."""
    root = tmp_path / "log"
    a = import_daystream(root, [write(tmp_path / "a.ds", DAYSTREAM[:8])], ZZZ)
    again = import_daystream(root, [write(tmp_path / "a2.ds", DAYSTREAM[:8])], ZZZ)
    assert (a.changes, again.changes, again.skipped, again.last) == (8, 0, 8, None)
    b = import_daystream(root, [write(tmp_path / "b.ds", DAYSTREAM[5:14])], ZZZ)
    assert (b.skipped, b.changes) == (3, 5) and export(root) == DAYSTREAM[:14]
    from mirrorline.log.retention import retain, set_applied

    set_applied(ChangeLog(root), "r", ChangeLog(root).durable())
    assert retain(ChangeLog(root)) and ChangeLog(root).segments() == []
    c = import_daystream(root, [write(tmp_path / "c.ds", DAYSTREAM[10:])], ZZZ)
    assert (c.skipped, c.changes) == (4, 5)
    assert export(root) == DAYSTREAM[14:]  # the addresses go on where the removed segments left them
    plain = import_daystream(root, [write(tmp_path / "d.ds", DELTAFLOOD[:1])], ZZZ)
    assert plain.changes == 1 and plain.skipped == 0


def test_import_is_atomic_for_the_whole_batch(tmp_path):
    root = tmp_path / "log"
    good = write(tmp_path / "good.ds", DAYSTREAM)
    bad = write(tmp_path / "bad.ds", [DAYSTREAM[0], DAYSTREAM[1], "_c\t1\t_s\t2\t_table\tzzz\t_action\tupsert"])
    with pytest.raises(DecodeError) as e:
        import_daystream(root, [good, bad], ZZZ)
    assert str(e.value).startswith(f"{bad}:3: unknown _action 'upsert'")
    assert e.value.context == {"file": str(bad), "line": 3}
    assert ChangeLog(root).segments() == [] and list((root / "schemas").iterdir()) == []
    assert [p.name for p in (root / "segments").iterdir()] == []  # no temp file left either
    import_daystream(root, [good], ZZZ)  # the writer's lock was released
    assert ChangeLog(root).count() == 18


def test_unconfigured_table_is_an_error_naming_what_to_add(tmp_path):
    with pytest.raises(DecodeError, match=r'add \[tables."public.zzz"\] with key'):
        import_daystream(tmp_path / "log", [write(tmp_path / "a.ds", DAYSTREAM)], {})


def test_a_table_already_in_the_log_needs_no_columns_in_the_config(tmp_path):
    root = tmp_path / "log"
    with LogWriter(root) as w:
        w.record_schema(TableSchema("public.zzz", (Column("a", "text", 25), Column("b", "text", 25)), ("a",)))
    r = import_daystream(root, [write(tmp_path / "a.ds", DAYSTREAM)], {})
    assert r.changes == 18
    assert {c.schema_version for c in ChangeLog(root).read()} == {1}


def test_import_while_a_writer_runs_is_refused(tmp_path):
    root = tmp_path / "log"
    with LogWriter(root), pytest.raises(LogError, match="another writer"):
        import_daystream(root, [write(tmp_path / "a.ds", DAYSTREAM)], ZZZ)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(DecodeError, match="cannot read"):
        import_daystream(tmp_path / "log", [tmp_path / "nope.ds"], ZZZ)


# -- the command line ------------------------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path) -> Path:
    zzz = {"key": ["a"], "columns": {"a": "text", "b": "text"}}
    return configs.write(tmp_path / "m.toml", log="./log", tables={"public.zzz": zzz})


def test_cli_import_then_export(tmp_path, config, capsys):
    seed = write(tmp_path / "seed.ds", DAYSTREAM)
    assert main(["log", "import", "-c", str(config), "--format", "daystream", str(seed)]) == 0
    assert "imported 18 changes in 16 transactions from 1 file(s)" in capsys.readouterr().err
    assert main(["log", "export", "-c", str(config), "--format", "daystream"]) == 0
    assert capsys.readouterr().out.splitlines() == DAYSTREAM
    for start in ("1507507201", "2017-10-09T00:00:01Z", "2017-10-09T00:00:01", "0/E:0", "1507507200:17"):
        assert main(["log", "export", "-c", str(config), "--from", start]) == 0
        assert capsys.readouterr().out.splitlines() == DAYSTREAM[18:], start
    assert main(["log", "import", "-c", str(config), str(seed)]) == 0
    assert "imported 0 changes" in (err := capsys.readouterr().err) and "20 line(s) imported before were skipped" in err


@pytest.mark.parametrize("start", ["yesterday", "16/ZZ:1", "1/2/3"])
def test_cli_bad_from_is_a_usage_error(config, capsys, start):
    assert main(["log", "export", "-c", str(config), "--from", start]) == 2
    err = capsys.readouterr().err
    assert "--from" in err and len(err.strip().splitlines()) == 1


def test_cli_bad_line_is_one_line_on_stderr_and_nothing_imported(tmp_path, config, capsys):
    bad = write(tmp_path / "bad.ds", [DAYSTREAM[0], "_c\t1\t_table\tzzz"])
    assert main(["log", "import", "-c", str(config), str(bad)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{bad}:2:" in err
    assert main(["log", "export", "-c", str(config)]) == 0
    assert capsys.readouterr().out == ""


def test_cli_malformed_lines_name_their_line(tmp_path, config, capsys):
    """A superscript digit passes str.isdigit() but is no integer; a binary line 3 is line 3."""
    sup = write(tmp_path / "sup.ds", [DAYSTREAM[0].replace("_s\t0", "_s\t\u00b2", 1)])
    assert "_s\t\u00b2" in sup.read_text()
    assert main(["log", "import", "-c", str(config), str(sup)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{sup}:1:" in err and "not a non-negative integer" in err
    binary = tmp_path / "bin.ds"
    binary.write_bytes((DAYSTREAM[0] + "\n" + DAYSTREAM[1] + "\n").encode() + b"\xff\xfe\x00bad\n")
    assert main(["log", "import", "-c", str(config), str(binary)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{binary}:3: not UTF-8 text" in err


def test_cli_export_of_no_log_is_a_clear_error(config, capsys):
    assert main(["log", "export", "-c", str(config)]) == 3
    assert "no change log" in capsys.readouterr().err


def test_a_replace_at_the_end_of_one_file_and_its_update_in_the_next_are_one_change(tmp_path):
    a = write(tmp_path / "a.ds", ["_c\t5\t_s\t0\t_table\tzzz\t_action\treplace\ta\told\t\t"])
    b = write(tmp_path / "b.ds", ["_c\t5\t_s\t1\t_table\tzzz\t_action\tupdate\ta\tnew\tb\tv"])
    r = import_daystream(tmp_path / "log", [a, b], ZZZ)
    assert r.transactions == 1 and r.changes == 1
    (c,) = ChangeLog(tmp_path / "log").read()
    assert (c.op, c.key, c.old_key) == (Op.UPDATE, ("new",), ("old",))


def test_a_delete_without_its_primary_key_is_still_an_error(tmp_path):
    with pytest.raises(DecodeError, match="lacks key column"):
        import_daystream(tmp_path / "log", [write(tmp_path / "a.ds", ["_table\tzzz\t_action\tdelete\tb\tx\t\t"])], ZZZ)


@pytest.mark.pg
def test_a_captured_log_and_an_imported_log_are_never_mixed(pg, tmp_path):
    """Imported transactions take positions after the log's last one; the source's next commits may not lie beyond
    them, so a log capture feeds refuses an import, and capture refuses a log that holds imports."""
    from mirrorline import config as cfg
    from mirrorline.capture.session import Capture

    pg.execute("CREATE TABLE public.items (id integer PRIMARY KEY); INSERT INTO public.items VALUES (1)")

    def conf(log: str) -> cfg.Config:
        return configs.load(
            tmp_path / f"{log}.toml",
            source={"dsn": pg.dsn, "slot": log, "publication": log},
            log=tmp_path / log,
            tables=["public.items"],
        )

    Capture(conf("captured"), once=True).run()
    with pytest.raises(LogError, match="is fed by capture") as e:
        import_daystream(tmp_path / "captured", [write(tmp_path / "a.ds", DAYSTREAM[:2])], ZZZ)
    assert "another [log] path" in str(e.value)
    import_daystream(tmp_path / "imported", [write(tmp_path / "b.ds", DAYSTREAM[:2])], ZZZ)
    before = ChangeLog(tmp_path / "imported").durable()
    with pytest.raises(LogError, match="holds changes imported from daystream files"):
        Capture(conf("imported"), once=True).run()
    assert ChangeLog(tmp_path / "imported").durable() == before
