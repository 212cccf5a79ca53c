"""The test harness every stage uses: one local SparkSession per test run, and throwaway PostgreSQL clusters
(``wal_level=logical``, free ports) that the harness starts itself and removes afterwards."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's one local SparkSession (``local[2]``, quiet logs)."""
    from mirrorline.sparkenv import get_spark

    session = get_spark()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A PostgreSQL cluster shared by the run (``wal_level=logical``); tests get their own database in it."""
    from mirrorline.pgcluster import PgCluster

    # large transactions are streamed by PostgreSQL past 64 kB: through capture, log, compile and apply
    with PgCluster({"logical_decoding_work_mem": "64kB"}) as cluster:
        yield cluster


@dataclass
class PgDatabase:
    cluster: Any
    name: str

    @property
    def dsn(self) -> str:
        return str(self.cluster.dsn(self.name))

    @property
    def url(self) -> str:
        return str(self.cluster.url(self.name))

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self.cluster.execute(sql, self.name))


@pytest.fixture
def pg(pg_cluster: Any, request: pytest.FixtureRequest) -> Iterator[PgDatabase]:
    """A fresh database in the shared cluster, dropped (with its replication slots) after the test."""
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:6]
    pg_cluster.create_database(name)
    yield PgDatabase(pg_cluster, name)
    pg_cluster.drop_database(name)


@pytest.fixture
def target_dbs(pg_cluster: Any) -> Iterator[list[str]]:
    """Names of databases a test creates in the shared cluster (as targets), dropped after it."""
    created: list[str] = []
    yield created
    for db in created:
        pg_cluster.drop_database(db)


@pytest.fixture
def pg_cluster_factory() -> Iterator[Callable[..., Any]]:
    """Start dedicated clusters with their own settings (e.g. ``logical_decoding_work_mem``); all stopped after."""
    from mirrorline.pgcluster import PgCluster

    started: list[PgCluster] = []

    def make(**settings: str) -> PgCluster:
        cluster = PgCluster(settings).start()
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()
