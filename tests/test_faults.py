"""The fault benchmark's shorter version (issue 16): SIGKILLs of run, capture and apply run as separate processes,
an immediate restart of the source, a walsender terminated, the PostgreSQL target stopped and the SQLite target
locked, all under a pgbench load; mirrorline restarted after each as a supervisor would; then every table of every
target equals the source: nothing lost, nothing applied twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.timeout(300)]  # its own limit: about 5x its time

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


@pytest.mark.timeout(600)
def test_faults_survived_nothing_lost_or_duplicated() -> None:
    import faults

    out = faults.main(
        ["--kills", "12", "--kill-every", "4", "--rate", "50", "--outage", "4", "--lock", "3",
         "--source-restarts", "1", "--walsender-kills", "1", "--seed", "7"]
    )  # fmt: skip
    assert out["rows_lost"] == 0 and out["rows_duplicated"] == 0, out["tables"]
    assert out["kills"] == 12 and set(out["kills_by_process"]) == {"run", "capture", "apply"}, out
    assert (out["source_restarts"], out["walsender_kills"], out["target_outages"], out["target_locks"]) == (1, 1, 1, 1)
    assert out["recoveries"] >= 12 and out["unrecovered"] == 0, out
