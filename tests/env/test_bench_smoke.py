"""Every benchmark still runs: each ``bench/*.py`` with a command line is run with ``--help`` (which imports all it
needs at module level and parses its options) and at a tiny size, where it must end well and print its one JSON line
of figures; the modules the others import are imported. A benchmark's figures are measured by running it at its own
size (README, "Figures"); this keeps one from rotting unseen. ``bench/faults.py`` runs in test_faults.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "__main__" in p.read_text())
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if "__main__" not in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_starts(script: str) -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120, cwd=BENCH
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:"), r.stdout


@pytest.mark.parametrize("module", MODULES)
def test_each_benchmark_module_imports(module: str) -> None:
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r}); import {module}"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=BENCH)
    assert r.returncode == 0, r.stderr


TINY = {
    "apply.py": (["--changes", "2000", "--history"], "distinct_keys"),
    "apply_targets.py": (["--rows", "1000"], "bench"),
    "bigtxn.py": (["--rows", "500"], "equal"),
    "capture.py": (["--changes", "2000"], "changes_per_s"),
    "capture.py --shape delete": (["--changes", "2000", "--rounds", "1"], "changes_per_s"),  # one streamed txn
    "compile.py": (["--sizes", "2000"], "sizes"),
    "live.py": (["--phase-seconds", "3", "--scale", "1", "--restart-transactions", "100"], "equal"),
    "log_write.py": (["--changes", "2000"], "write_changes_per_s"),
    "snapshot.py": (["--rows", "2000"], "copy_pipe_s"),
    "unit.py": (["--sizes", "100"], "100"),
    "verify.py": (["--scale", "1"], "verify_s"),
}


TINY_RUNNERS = 2  # tiny runs side by side: they mostly wait (a JVM starting, a cluster, a unit's latency)


def _run_tiny(script: str) -> subprocess.CompletedProcess[str]:
    file, *options = script.split()  # (a key may name options beside its file's)
    args, _ = TINY[script]
    return subprocess.run(
        [sys.executable, str(BENCH / file), *options, *args], capture_output=True, text=True, timeout=600, cwd=BENCH
    )


@pytest.fixture(scope="module")
def tiny_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """The tiny run of every benchmark whose test was selected, started together, two at a time."""
    wanted = {
        item.callspec.params["script"]
        for item in request.session.items
        if item.originalname == "test_each_benchmark_runs_at_a_tiny_size" and hasattr(item, "callspec")
    }
    with ThreadPoolExecutor(TINY_RUNNERS) as pool:
        yield {s: pool.submit(_run_tiny, s) for s in sorted(wanted)}


@pytest.mark.parametrize("script", sorted(TINY))
def test_each_benchmark_runs_at_a_tiny_size(
    script: str, tiny_runs: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    r = tiny_runs[script].result()
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout[-3000:]
    figures = json.loads(lines[0])
    assert TINY[script][1] in figures, figures
    if script == "live.py":  # the heartbeat read in the SQLite and PostgreSQL targets, every phase
        for phase in figures["phases"].values():
            assert {n: f["samples"] > 0 for n, f in phase["heartbeat_lag"].items()} == {
                "pg": True,
                "sqlite": True,
            }, phase
        assert all(t["equal"] for t in figures["equal"].values()), figures["equal"]


def test_every_benchmark_has_a_tiny_run() -> None:
    assert {k.split()[0] for k in TINY} == set(SCRIPTS) - {"faults.py"}


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 10 and "snapshot.py" in SCRIPTS and MODULES == ["layout_floor"]
