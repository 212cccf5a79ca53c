"""The fault benchmark's shorter version: SIGKILLs of run, capture and apply run as separate processes, an
immediate restart of the source, a walsender terminated, the PostgreSQL target stopped and the SQLite target locked,
a streamed transaction, a TRUNCATE and an added column under load, ``verify`` beside ``run``, and the slot dropped
while mirrorline was stopped (refused clearly: every target marked for a reload, then loaded again), all under a
pgbench load, into SQLite, PostgreSQL, DuckDB and Delta targets; mirrorline restarted after each as a supervisor
would; then every table of every target equals the source, every column: nothing lost, nothing applied twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.timeout(300)]  # its own limit: about 5x its time

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


@pytest.mark.timeout(600)
def test_faults_survived_nothing_lost_or_duplicated() -> None:
    import faults

    out = faults.main(
        ["--kills", "11", "--kill-every", "4", "--rate", "50", "--outage", "4", "--lock", "3",
         "--source-restarts", "1", "--walsender-kills", "1", "--streamed-transactions", "1", "--streamed-rows", "5000",
         "--truncates", "1", "--schema-changes", "1", "--verify-runs", "1", "--slot-drops", "1", "--seed", "7"]
    )  # fmt: skip
    assert out["rows_lost"] == 0 and out["rows_duplicated"] == 0, out["tables"]
    # (every tenth kill switches between one run process and capture + apply: run and at least one of those)
    assert out["kills"] == 11 and {"run"} < set(out["kills_by_process"]) <= {"run", "capture", "apply"}, out
    assert (out["source_restarts"], out["walsender_kills"], out["target_outages"], out["target_locks"]) == (1, 1, 1, 1)
    assert (out["streamed_transactions"], out["truncates"], out["schema_changes"], out["slot_drops"]) == (1, 1, 1, 1)
    assert out["verify_exit_codes"] == {"0": 1} and out["slot_drops_refused_clearly"] == 1 and out["nothing_lost"], out
    assert out["recoveries"] >= 11 and out["unrecovered"] == 0, out
