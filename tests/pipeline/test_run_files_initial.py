"""A target seeded by files (seed 001's manual transfer): with ``initial = "files"`` run does not load it
over the wire; status shows it waiting for files; the log is kept for it; `snapshot export` then `snapshot load`,
made while run goes on, complete it, run takes it up and it ends equal to the source."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import oracle
import pytest
from snapshot_support import RunnerThread, Workload, create_items, target_urls, write_config
from waiting import wait_until

from mirrorline.cli.main import main
from mirrorline.errors import MirrorlineError
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import readers
from mirrorline.pipeline import Runner
from mirrorline.snapshot import Options, export_snapshot, load_snapshot
from mirrorline.status import status
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def _fail_on(errors: list[BaseException]) -> bool:
    """False while the runner's thread raised nothing (a wait goes on); fails with what it raised."""
    assert not errors, errors
    return False


def test_a_target_waits_for_files_and_joins_once_they_are_loaded(
    pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str]
) -> None:
    create_items(pg.dsn, rows=3000)
    urls = target_urls(tmp_path, pg.cluster, ["sqlite", "postgresql"], target_dbs)
    targets = {"near": urls["postgresql"], "far": {"url": urls["sqlite"], "initial": "files"}}
    cfg = write_config(tmp_path, pg.dsn, targets, {"public.items": {}})
    assert cfg.targets["far"].initial == "files" and cfg.targets["near"].initial == "wire"
    said: list[str] = []
    runner = Runner(cfg, on_message=said.append)
    thread = RunnerThread(runner)
    errors = thread.errors
    thread.start()
    work = Workload(pg.dsn, max_id=3000).start()
    try:
        wait_until(
            lambda: ("far" in readers(ChangeLog(cfg.log.path)) and runner.loaded.is_set()) or _fail_on(errors),
            timeout=120,
            what="the log is kept for far and near is loaded",
        )
        assert any("target far: waiting for files" in m for m in said)
        time.sleep(2)  # changes flow to near; far is not loaded over the wire
        st = status(cfg)
        states = {t.name: t.state for t in st.targets}
        assert states["far"] == "waiting for files", states
        assert any(w.startswith("target far waits for files") and "the log keeps" in w for w in st.warnings), (
            st.warnings
        )
        (tmp_path / "out").mkdir()
        out = export_snapshot(cfg, tmp_path / "out", options=Options(progress=False))
        load_snapshot(cfg, "far", out.folder, options=Options(progress=False))
        wait_until(
            lambda: any("target far: loaded from files" in m for m in said) or _fail_on(errors),
            timeout=180,
            what="run says far is loaded from files",
        )
        time.sleep(1)
    finally:
        work.stop()
    # a last change after the workload: once the log holds it, it holds everything the source did
    (end,) = pg.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0]
    pg.execute("UPDATE public.items SET qty = qty + 1 WHERE id = 1")

    def at_the_end() -> bool:
        log = ChangeLog(cfg.log.path)
        ends = {n: r.applied for n, r in readers(log).items() if n in ("near", "far")}
        durable = log.durable()
        return (
            durable is not None
            and durable.lsn > int(end)
            and len(ends) == 2
            and all(p is not None and p >= durable for p in ends.values())
        )

    try:  # both reach the log's end, and the log the source's
        wait_until(
            lambda: at_the_end() or _fail_on(errors),
            timeout=120,
            interval=0.2,
            what="both targets reach the log's end, and the log the source's",
            context=lambda: {n: r.applied for n, r in readers(ChangeLog(cfg.log.path)).items()},
        )
    finally:
        runner.stop()
        thread.join(60)
    assert not errors, errors
    for kind in ("postgresql", "sqlite"):  # near and far, read independently before verify is asked
        oracle.assert_same(pg.dsn, kind, urls[kind], "public.items")
    report = verify(cfg)
    assert report.ok, report.text()
    assert {t.name: t.state for t in status(cfg).targets}["far"] in ("live", "catching up")


def test_run_with_every_target_waiting_for_files_says_what_to_do(
    pg: Any, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create_items(pg.dsn, rows=10)
    far = {"url": f"sqlite:///{tmp_path / 'far.db'}", "initial": "files"}
    cfg = write_config(tmp_path, pg.dsn, {"far": far}, {"public.items": {}})
    with pytest.raises(MirrorlineError, match="every target waits for files") as e:
        Runner(cfg).run()
    assert "snapshot load" in str(e.value)
    assert "far" in readers(ChangeLog(cfg.log.path))  # the log is kept for it meanwhile
    capsys.readouterr()
    assert main(["apply", "--once", "-c", str(cfg.file), "--target", "far"]) == 3
    assert "target far waits for files" in capsys.readouterr().err
