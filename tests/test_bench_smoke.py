"""Every benchmark still starts: each ``bench/*.py`` with a command line is run with ``--help`` (which imports all it
needs at module level and parses its options), and the modules the others import are imported. A benchmark's
figures are measured by running it (README, "Figures"); this only keeps one from rotting unseen, as
``bench/snapshot.py`` once did (an import of a name that had moved)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
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


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 10 and "snapshot.py" in SCRIPTS and MODULES == ["layout_floor"]
