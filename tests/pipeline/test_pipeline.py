"""End to end: a real PostgreSQL through capture, the log and Spark to each target, in both apply modes."""

from __future__ import annotations

import pytest
from patching import patch_where_used
from pipeline_support import assert_same, config_text, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.pipeline import Applier
from mirrorline.workload import EVENTS, Workload

pytestmark = [pytest.mark.pg, pytest.mark.spark]
# fixed workload seeds (printed): a failure is replayed by running the test again
KINDS = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")
SEEDS = {(k, m): 11 + i for i, (k, m) in enumerate((k, m) for k in KINDS for m in ("update", "mirror"))}


@pytest.mark.parametrize("mode", ["update", "mirror"])
@pytest.mark.parametrize("kind", ["postgresql", "sqlite", "duckdb", "delta", "iceberg"])
def test_random_workload_replicates_exactly(pg, pg_cluster, spark, tmp_path, kind, mode):
    seed = SEEDS[(kind, mode)]
    print(f"workload seed {seed}")
    work = Workload(pg.dsn, seed=seed)
    work.create()
    url = target_url(kind, tmp_path, pg_cluster, f"tgt_{kind}_{mode}_{pg.name[-6:]}")
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(config_text(pg.dsn, tmp_path / "log", {"t": (url, mode)}, max_changes=400))
    conf = cfg.load(conf_file)
    Capture(conf, once=True).run()  # slot and publication before the workload

    applier = Applier(conf, spark=spark)
    try:
        for round_ in range(2):  # the second round applies onto the state the first left
            work.run(transactions=120)
            if round_ == 0:
                work.every_kind()
                work.run(transactions=20)
            else:
                work.large_transaction(1000)
                work.large_transaction(600, abort=True)
            stats = Capture(conf, once=True).run()
            if round_ == 1:  # logical_decoding_work_mem is 64kB in the test cluster
                assert stats.streamed >= 1 and stats.aborted >= 1, "the large transactions were streamed (one aborted)"
            reports = applier.catch_up()
            assert len(reports) >= 2, "units are closed by max_changes"
            assert applier.positions()["t"] == applier.log.durable()
            assert_same(pg.dsn, kind, url)
        assert applier.catch_up() == [], "nothing is applied twice"
        print(f"workload events {dict(work.counts)}")
        assert all(work.counts[e] >= 1 for e in EVENTS), f"every kind of event happened: {dict(work.counts)}"
    finally:
        applier.close()


@pytest.mark.parametrize("where", ["driver", "parquet"])
def test_large_units_replicate_exactly_with_net_rows_on_the_driver_or_through_parquet(
    pg, pg_cluster, spark, tmp_path, monkeypatch, where
):
    """Units larger than the small compiler's take the general fold; with at most ``driver_unit`` changes its net rows
    come to the driver through Arrow, else through Parquet. Both replicate exactly, into every kind of target."""
    from mirrorline.compile import spark as compile_spark

    work = Workload(pg.dsn, seed=41)
    work.create()
    kinds = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")
    urls = {k: target_url(k, tmp_path, pg_cluster, f"large_{where}_{k}_{pg.name[-6:]}") for k in kinds}
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(config_text(pg.dsn, tmp_path / "log", {k: (u, "update") for k, u in urls.items()}))
    conf = cfg.load(conf_file)
    Capture(conf, once=True).run()
    seen: list[tuple[bool, bool]] = []  # (to_driver asked, net rows on the driver)
    real = compile_spark.compile_changes

    def spy(*args, **kwargs):
        batch = real(*args, **kwargs)
        seen.append((kwargs.get("to_driver", False), batch.on_driver))
        return batch

    patch_where_used(monkeypatch, compile_spark, "compile_changes", spy)
    applier = Applier(conf, spark=spark)
    applier.small_unit, applier.catch_up_changes = 50, 100
    if where == "parquet":
        applier.compiler.driver_unit = 0
    try:
        work.run(transactions=150)
        work.every_kind()
        Capture(conf, once=True).run()
        reports = applier.catch_up()
        assert reports and applier.positions() == dict.fromkeys(kinds, applier.log.durable())
        for k, u in urls.items():
            assert_same(pg.dsn, k, u)
        want = where == "driver"
        assert seen and all(asked == want for asked, _ in seen), seen
        assert any(on == want for _, on in seen), seen  # (a unit whose key changes leave columns unsent: Parquet)
    finally:
        applier.close()
