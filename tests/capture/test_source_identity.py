"""The log knows its source: a slot dropped while nothing captured makes every target *need a reload*
(never "up to date" with changes missing), and the reload brings it back exactly; another system or WAL gone back
stops capture with a message naming what may be missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from pipeline_support import capture_and_apply, target_url

from mirrorline import status as status_mod
from mirrorline.capture import identity
from mirrorline.capture.identity import SourceIdentity, judge
from mirrorline.capture.session import Capture
from mirrorline.errors import MirrorlineError, SourceError
from mirrorline.log import source
from mirrorline.pipeline import Applier
from mirrorline.position import Position
from mirrorline.snapshot.run import snapshot_target

ID = SourceIdentity("7300000000000000001", 1, "app", "mirrorline")


def test_judge() -> None:
    fresh = judge(None, ID, slot_exists=False, log_has_positions=False, durable=None, current_lsn=100)
    assert fresh == identity.Verdict(slot_lost=False, record=True)
    same = judge(ID, ID, slot_exists=True, log_has_positions=True, durable=Position(90, 1), current_lsn=100)
    assert same == identity.Verdict(slot_lost=False, record=False)
    lost = judge(ID, ID, slot_exists=False, log_has_positions=True, durable=Position(90, 1), current_lsn=100)
    assert lost.slot_lost and lost.record
    with pytest.raises(SourceError, match="another PostgreSQL system"):
        other = SourceIdentity("7399999999999999999", 1, "app", "mirrorline")
        judge(ID, other, slot_exists=True, log_has_positions=True, durable=None, current_lsn=100)
    with pytest.raises(SourceError, match="the source went back"):
        judge(ID, ID, slot_exists=True, log_has_positions=True, durable=Position(200, 1), current_lsn=100)
    with pytest.raises(SourceError, match="database other"):
        judge(ID, SourceIdentity(ID.system_identifier, 1, "other", "mirrorline"), slot_exists=True,
              log_has_positions=True, durable=None, current_lsn=100)  # fmt: skip
    # a promotion moves the timeline: recorded anew, nothing lost while the slot is there (PostgreSQL 17's failover
    # slots)
    promoted = SourceIdentity(ID.system_identifier, 2, "app", "mirrorline")
    moved = judge(ID, promoted, slot_exists=True, log_has_positions=True, durable=None, current_lsn=100)
    assert moved == identity.Verdict(slot_lost=False, record=True)


@pytest.mark.pg
@pytest.mark.spark
def test_a_slot_dropped_while_nothing_captured(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text); INSERT INTO public.t VALUES (0, 'zero')")
    url = target_url("sqlite", tmp_path, pg_cluster, "lost")
    conf = configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables=["public.t"],
        targets={"lite": url},
    )
    assert conf.source is not None
    Capture(conf, once=True).run()
    snapshot_target(conf, "lite")
    pg.execute("INSERT INTO public.t SELECT i, 'a' || i FROM generate_series(1, 100) i")
    capture_and_apply(conf, spark)
    oracle.assert_same(pg.dsn, "sqlite", url, "public.t")
    recorded = json.loads((tmp_path / "log" / source.FILE).read_text())
    assert recorded["slot"] == conf.source.slot and recorded["database"] == pg.name

    # 100 changes nothing captured, the slot dropped, 100 more
    pg.execute("UPDATE public.t SET v = 'b' || id WHERE id <= 100")
    pg.execute(f"SELECT pg_drop_replication_slot('{conf.source.slot}')")
    pg.execute("INSERT INTO public.t SELECT i, 'c' || i FROM generate_series(101, 200) i")
    stats = Capture(conf, once=True).run()
    assert stats.slot_lost == ["lite"]
    st = status_mod.status(conf)
    assert st.targets[0].state == "needs reload" and "slot" in st.targets[0].reload
    assert any("needs a reload" in p and "was lost" in p for p in st.problems())
    with pytest.raises(MirrorlineError, match=r"needs a reload: the replication slot .* was lost"):
        Applier(conf, spark=spark)
    # the one command that recovers: load the target again; replication goes on from there
    snapshot_target(conf, "lite")
    pg.execute("UPDATE public.t SET v = 'd' WHERE id = 150")
    capture_and_apply(conf, spark)
    oracle.assert_same(pg.dsn, "sqlite", url, "public.t")
    assert status_mod.status(conf).problems() == []


@pytest.mark.pg
def test_a_log_fed_by_another_system_is_refused(pg: Any, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE public.t (id integer PRIMARY KEY)")
    conf = configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        tables=["public.t"],
        targets={"lite": f"sqlite:///{tmp_path / 't.db'}"},
    )
    Capture(conf, once=True).run()
    path = tmp_path / "log" / source.FILE
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "system_identifier": "1"}))
    with pytest.raises(SourceError, match="another PostgreSQL system"):
        Capture(conf, once=True).run()
