"""The command line: every DESIGN §9 command is present, help is instant, errors are one line with the right code."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mirrorline.cli.main import COMMANDS, build_parser, main

DESIGN_COMMANDS = {"run", "capture", "apply", "snapshot", "log", "status", "verify", "demo"}


def test_every_design_command_is_in_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in DESIGN_COMMANDS:
        assert f"    {name} " in out
    assert {name for name, _, _ in COMMANDS} >= DESIGN_COMMANDS


def test_help_does_not_import_spark():
    code = "import sys; from mirrorline.cli.main import build_parser; build_parser(); print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_help_is_quick():
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "mirrorline.cli.main", "--help"], capture_output=True, check=True)
    assert time.monotonic() - t0 < 10  # generous: a loaded 2-core machine; the point is "no Spark start"


def test_no_command_is_a_usage_error():
    assert main([]) == 2


def test_unknown_option_is_a_usage_error():
    assert main(["status", "--no-such-option"]) == 2


def test_bad_config_is_one_line_on_stderr_with_exit_2(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text('[apply]\nlatency = "soon"\n[targets.x]\nurl="sqlite:///x.db"\n')
    code = main(["status", "-c", str(p)])
    err = capsys.readouterr().err.strip()
    if code == 2:
        assert "apply.latency" in err and len(err.splitlines()) == 1
    else:  # pragma: no cover - status must load the config first
        pytest.fail(f"exit {code}: {err}")


def test_subcommand_parsers_accept_documented_arguments():
    parser = build_parser()
    args = parser.parse_args(["snapshot", "load", "--target", "cache", "/tmp/x", "-c", "m.toml"])
    assert (args.action, args.dir, args.target, args.config) == ("load", "/tmp/x", "cache", "m.toml")
    args = parser.parse_args(["log", "export", "--format", "daystream", "--from", "16/B374D848:3"])
    assert args.start == "16/B374D848:3"
    args = parser.parse_args(["run", "--once"])
    assert args.once


def test_verbose_before_or_after_the_command() -> None:
    from mirrorline.cli.main import build_parser

    p = build_parser()
    assert [p.parse_args(a).verbose for a in (["-v", "status"], ["status", "-v"], ["status"], ["-vv", "status"])] == [
        1,
        1,
        0,
        2,
    ]


def test_an_internal_error_is_not_a_difference(capsys, monkeypatch):
    """A bug ends a command with its traceback and exit 4, never 1 (which verify gives for a difference)."""
    from mirrorline.cli import verify_cmd

    def broken(args):
        raise RuntimeError("the key array and value array must have the same length")

    monkeypatch.setattr(verify_cmd, "run", broken)
    assert main(["verify", "-c", "nowhere.toml"]) == 4
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error: RuntimeError: the key array" in err


def test_a_unit_line_splits_an_apply_of_a_second_or_more_by_phase(capsys):
    """``run``'s line per unit: each target's seconds; where a target took a second or more, its phases (longest
    first, those under 0.05 s left out, ``other`` the rest of its seconds), in brackets a line parser reading
    ``name seconds`` pairs passes over."""
    import re

    from mirrorline.apply.target import ApplyResult
    from mirrorline.cli._common import print_unit
    from mirrorline.pipeline import UnitReport
    from mirrorline.position import Position

    start, end = Position(0x100, 0), Position(0x200, 9)
    pg = ApplyResult("pg", start, end, phases={"insert": 12.1, "commit": 0.4, "stage": 0.01})
    quick = ApplyResult("duckdb", start, end, phases={"insert": 0.2})
    report = UnitReport(
        start, end, 10, ["pg", "duckdb"], True, 0.5, {"pg": 12.72, "duckdb": 0.3}, {"pg": pg, "duckdb": quick}
    )
    print_unit(report)
    line = capsys.readouterr().err
    assert "applied: pg 12.72s [insert 12.10, commit 0.40, other 0.21], duckdb 0.30s;" in line
    assert dict(re.findall(r"(\S+) ([0-9.]+)s", line.split("applied: ")[1])) == {"pg": "12.72", "duckdb": "0.30"}


@pytest.mark.parametrize("preset", [None, "system"])
def test_arrow_allocates_from_jemalloc_unless_the_user_names_an_allocator(preset):
    """The command sets Arrow's allocator before pyarrow is imported: jemalloc, or the one the user's environment
    names."""
    import os

    code = (
        "from mirrorline.cli.main import arrow_allocator; arrow_allocator(); "
        "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if preset:
        env["ARROW_DEFAULT_MEMORY_POOL"] = preset
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == (preset or "jemalloc")


@pytest.mark.parametrize("preset", [None, "dirty_decay_ms:2000"])
def test_arrows_jemalloc_gives_freed_pages_back_sooner_unless_the_user_says_otherwise(preset):
    """The command has Arrow's jemalloc give freed pages back after 100 ms (``cli.main.ARROW_JEMALLOC_CONF``), or
    as the user's ``JE_ARROW_MALLOC_CONF`` says: read back from jemalloc's own statistics, so that a pyarrow whose
    jemalloc reads another variable fails here."""
    import os
    import re

    code = (
        "import os; from mirrorline.cli.main import arrow_allocator; arrow_allocator(); "
        "os.environ['JE_ARROW_MALLOC_CONF'] += ',stats_print:true'; "
        "import pyarrow as pa; pa.array(range(1000))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "JE_ARROW_MALLOC_CONF")}
    if preset:
        env["JE_ARROW_MALLOC_CONF"] = preset
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stderr
    decay = re.findall(r"opt\.(dirty|muzzy)_decay_ms: (\d+)", err)
    assert decay == ([("dirty", "2000"), ("muzzy", "1000")] if preset else [("dirty", "100"), ("muzzy", "100")])


def test_the_command_hands_the_gil_over_sooner_than_python_does():
    """A command's threads hand the GIL over every millisecond, not every 5 (``cli.main.SWITCH_INTERVAL``: threads
    in DuckDB, SQLite and psycopg take it back often)."""
    code = (
        "import sys; from mirrorline.cli import main as m; "
        "m.main = lambda: print(sys.getswitchinterval()) or 0; m.entry()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert float(out) == 0.001 != sys.getswitchinterval()


def test_config_before_or_after_the_command(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """``-c`` counts the same before the command (``mirrorline -c x.toml status``) as after it; without it,
    $MIRRORLINE_CONFIG, else ./mirrorline.toml."""
    from mirrorline.cli.main import build_parser, main

    p = build_parser()
    assert p.parse_args(["-c", "a.toml", "status"]).config == "a.toml"
    assert p.parse_args(["--config", "a.toml", "verify", "--json"]).config == "a.toml"
    assert p.parse_args(["-c", "a.toml", "status", "-c", "b.toml"]).config == "b.toml"  # the command's own wins
    missing = tmp_path / "nope.toml"
    for argv in (["-c", str(missing), "status"], ["status", "-c", str(missing)]):
        assert main(argv) == 2
        assert f"{missing}: no such file" in capsys.readouterr().err
    monkeypatch.setenv("MIRRORLINE_CONFIG", str(missing))
    assert main(["status"]) == 2 and f"{missing}: no such file" in capsys.readouterr().err
