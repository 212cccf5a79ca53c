"""An upgrade: a change log, targets and positions written by an earlier mirrorline (the code of commit ``EARLIER``,
taken out of this repository's history) are taken up by this one. The earlier code loads five targets and applies;
then it captures changes into the log that it does not apply; more changes wait in the slot; this code's ``run``
applies both, exactly once, and ``verify`` and ``status`` read what the earlier code wrote. Every target is read by
the tests' own reader (README "Run it in production", upgrades)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from snapshot_support import target_urls

pytestmark = [pytest.mark.pg, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
# The code of 2026-11-29 (LICENSE and CHANGELOG added): before history mode, the source's start checks, the
# publication's name quoted in the stream's options.
EARLIER = "f7d3ca2dd5f9a36e280a56f58547143639aa6919"
KINDS = ["sqlite", "duckdb", "postgresql", "delta", "iceberg"]
TABLES = ["public.items", '"My Schema"."Order Items"']  # as the configuration names them
NAMES = ["public.items", "My Schema.Order Items"]  # as mirrorline and the reader name them


def _earlier_source(into: Path) -> Path:
    """The earlier commit's ``src/`` folder, extracted from git (skipped outside a git checkout holding it)."""
    r = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", EARLIER, "src"], capture_output=True, check=False
    )
    if r.returncode != 0:
        pytest.skip(f"commit {EARLIER[:12]} is not in this checkout's history: {r.stderr.decode().strip()}")
    with tarfile.open(fileobj=BytesIO(r.stdout)) as tar:
        tar.extractall(into, filter="data")
    src = into / "src"
    where = subprocess.run(
        [sys.executable, "-c", "import mirrorline; print(mirrorline.__file__)"],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(src)), where  # the earlier code is the one that runs, not this checkout's
    return src


# The earlier code's command ended by tearing the interpreter down, which a native thread of a target's library can
# abort after the command succeeded (SIGABRT, "PyGILState_Release ... finalizing"; this code's ``cli.main._finish``
# ends without the teardown). What is under test is what the earlier code wrote, not how its process ended: it runs
# through this launcher, which ends its command as this code ends its own.
_EARLIER_LAUNCH = """
import atexit, logging, os, sys, threading
from mirrorline.cli.main import entry
try:
    entry()
    code = 0
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
threading._shutdown()
atexit._run_exitfuncs()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
"""


def _mirrorline(args: list[str], src: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = ["-m", "mirrorline.cli.main"]
    if src is not None:  # the earlier code first on the path, shadowing the installed package
        env["PYTHONPATH"] = str(src)
        run = ["-c", _EARLIER_LAUNCH]
    env["MIRRORLINE_SPARK_DRIVER_MEMORY"] = "1g"
    return subprocess.run([sys.executable, *run, *args], cwd=cwd, env=env, capture_output=True, text=True)


def _change(pg: Any, step: int) -> None:
    base = step * 1000
    pg.execute(
        f"INSERT INTO public.items SELECT g, 'v' || g, g * 1.5 FROM generate_series({base}, {base + 199}) g;"
        f"UPDATE public.items SET v = v || '+', n = n + 1 WHERE id % 7 = {step};"
        f"DELETE FROM public.items WHERE id % 11 = {step};"
        f"INSERT INTO \"My Schema\".\"Order Items\" (sku, qty, note) SELECT 'k' || g, {step}, repeat('x', 3000) || g "
        f"FROM generate_series({base}, {base + 49}) g;"
        f'UPDATE "My Schema"."Order Items" SET qty = qty + 1 WHERE qty = {step - 1};'
    )


def test_a_log_and_targets_written_by_the_earlier_code_are_taken_up(
    pg: Any, pg_cluster: Any, tmp_path: Path, target_dbs: list[str]
) -> None:
    earlier = _earlier_source(tmp_path / "earlier")
    pg.execute(
        "CREATE TABLE public.items (id int PRIMARY KEY, v text, n numeric);"
        'CREATE SCHEMA "My Schema";'
        'CREATE TABLE "My Schema"."Order Items" (note text, sku text, qty int, PRIMARY KEY (qty, sku))'
    )
    pg.execute('ALTER TABLE "My Schema"."Order Items" ALTER COLUMN note SET STORAGE EXTERNAL')
    _change(pg, 1)
    urls = target_urls(tmp_path, pg_cluster, KINDS, target_dbs)
    cfg = tmp_path / "m.toml"
    configs.write(cfg, source=pg.dsn, log=tmp_path / "log", tables=TABLES, targets={k: u for k, u in urls.items()})

    r = _mirrorline(["run", "--once", "-c", str(cfg)], earlier, tmp_path)  # load and apply, the earlier code
    assert r.returncode == 0, r.stderr
    _change(pg, 2)
    r = _mirrorline(["capture", "--once", "-c", str(cfg)], earlier, tmp_path)  # in the log, applied by no one
    assert r.returncode == 0, r.stderr
    _change(pg, 3)  # in the slot

    r = _mirrorline(["status", "-c", str(cfg)], None, tmp_path)  # this code reads what the earlier one wrote
    assert r.returncode == 1 and "the log does not hold" in r.stdout, r.stdout + r.stderr  # behind: said, exit 1
    assert all(k in r.stdout for k in KINDS), r.stdout
    r = _mirrorline(["run", "--once", "-c", str(cfg)], None, tmp_path)
    assert r.returncode == 0, r.stderr
    for kind, url in urls.items():
        for table in NAMES:
            oracle.assert_same(pg.dsn, kind, url, table)
    _change(pg, 4)
    r = _mirrorline(["run", "--once", "-c", str(cfg)], None, tmp_path)
    assert r.returncode == 0, r.stderr
    r = _mirrorline(["verify", "-c", str(cfg)], None, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for kind, url in urls.items():
        for table in NAMES:
            oracle.assert_same(pg.dsn, kind, url, table)
