"""TLS to PostgreSQL, source and target, through the DSN: a throwaway cluster with a self-signed
certificate authority that refuses connections without TLS; capture, a snapshot read by Spark tasks, apply and
verify all connect with ``sslmode=verify-full`` and ``sslrootcert``; a wrong root certificate is a clear one-line
error that names no secret."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import oracle
import psycopg2
import pytest
from snapshot_support import create_items, write_config

from mirrorline.cli.main import main
from mirrorline.pgcluster import PgCluster

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(folder: Path) -> None:
    """A certificate authority and a server certificate for 127.0.0.1 signed by it."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=mirrorline test CA", cwd=folder)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=folder)  # fmt: skip
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf", cwd=folder)  # fmt: skip


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[tuple[PgCluster, Path]]:
    """A cluster that takes TLS connections only (over TCP), and the CA certificate that signed its own."""
    certs = tmp_path / "certs"
    certs.mkdir()
    _certificates(certs)
    cluster = PgCluster().start()
    try:
        for name in ("server.crt", "server.key"):
            dst = cluster.datadir / name
            shutil.copy(certs / name, dst)
            os.chmod(dst, 0o600)
            if os.geteuid() == 0:
                shutil.chown(dst, "postgres", "postgres")
        hba = cluster.datadir / "pg_hba.conf"
        rules = "hostnossl all all 0.0.0.0/0 reject\nhostnossl replication all 0.0.0.0/0 reject\n"
        hba.write_text(rules + hba.read_text())
        cluster.execute("ALTER SYSTEM SET ssl = on")
        cluster.execute("SELECT pg_reload_conf()")
        yield cluster, certs / "ca.crt"
    finally:
        cluster.stop()


def test_everything_connects_through_tls(tls_cluster: tuple[PgCluster, Path], spark: Any, tmp_path: Path, capsys):
    cluster, ca = tls_cluster
    tls = f"sslmode=verify-full sslrootcert={ca}"
    with pytest.raises(psycopg2.OperationalError, match=r"no encryption|SSL off"):
        psycopg2.connect(cluster.dsn() + " sslmode=disable")  # the server refuses plain connections
    conn = psycopg2.connect(f"{cluster.dsn()} {tls}")
    with conn.cursor() as cur:
        cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        assert cur.fetchone() == (True,)
    conn.close()
    source = f"{cluster.dsn()} {tls}"
    create_items(source, rows=500)
    cluster.create_database("dw")
    target = f"postgresql://postgres@127.0.0.1:{cluster.port}/dw?sslmode=verify-full&sslrootcert={ca}"
    cfg = write_config(tmp_path, source, {"dw": target, "cache": f"sqlite:///{tmp_path / 'cache.db'}"},
                       {"public.items": {}})  # fmt: skip
    conf = str(cfg.file)
    assert main(["run", "--once", "-c", conf]) == 0  # the slot, the snapshots (Spark tasks read it), capture, apply
    cluster.execute("INSERT INTO public.items (id, name, qty) SELECT g, 'tls', g FROM generate_series(1001, 1100) g")
    assert main(["run", "--once", "-c", conf]) == 0
    oracle.assert_same(source, "sqlite", f"sqlite:///{tmp_path / 'cache.db'}", "public.items")  # before verify
    oracle.assert_same(source, "postgresql", target, "public.items")
    assert main(["verify", "-c", conf]) == 0
    out = capsys.readouterr().out
    assert "public.items" in out and "DIFFERS" not in out
    rows = cluster.execute("SELECT count(*) FROM public.items", "dw")
    assert rows == [(600,)]

    # a root certificate that did not sign the server's: a clear error, nothing secret in it
    other = tmp_path / "other"
    other.mkdir()
    _certificates(other)
    bad = write_config(tmp_path, f"{cluster.dsn()} password=s3cret sslmode=verify-full sslrootcert={other / 'ca.crt'}",
                       {"cache": f"sqlite:///{tmp_path / 'cache.db'}"}, {"public.items": {}}, "bad.toml")  # fmt: skip
    capsys.readouterr()
    assert main(["capture", "--once", "-c", str(bad.file)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "certificate verify failed" in err and "s3cret" not in err
