"""Throwaway PostgreSQL clusters with ``wal_level=logical`` on free ports: for tests, the demo and benchmarks.

The server binaries come from ``/usr/lib/postgresql/*/bin`` (Debian's packages; ``./dev setup`` installs them when the
machine lacks them). PostgreSQL refuses to run as root, so when we are root the server runs as the ``postgres`` user.
The cluster listens on 127.0.0.1 only, with trust authentication, and is removed when stopped.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from mirrorline.errors import MirrorlineError

DEFAULT_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "100",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "max_wal_size": "2GB",
    "wal_sender_timeout": "60s",
    "max_slot_wal_keep_size": "10GB",  # bounded, as README "Prepare the source" advises
    "logging_collector": "off",
    "log_min_messages": "warning",
}


def find_bindir() -> Path:
    """The newest PostgreSQL server's bin folder, or ``$MIRRORLINE_PG_BINDIR``."""
    env = os.environ.get("MIRRORLINE_PG_BINDIR")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise MirrorlineError(
            "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin",
            hint="run ./dev setup (it installs Debian's postgresql package), or set MIRRORLINE_PG_BINDIR",
        )
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


class PgCluster:
    """A PostgreSQL cluster of our own. Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, settings: Mapping[str, str] | None = None, base_dir: str | None = None) -> None:
        self.bindir = find_bindir()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self._base_dir = base_dir
        self.root: Path | None = None
        self.port = 0
        self.user = "postgres"

    @property
    def datadir(self) -> Path:
        assert self.root is not None, "cluster not started"
        return self.root / "data"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [*_as_server_user(), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/")
        if check and proc.returncode != 0:
            raise MirrorlineError(f"{Path(args[0]).name} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
        return proc

    def start(self) -> PgCluster:
        self.root = Path(tempfile.mkdtemp(prefix="mirrorline-pg-", dir=self._base_dir))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o755)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            self.user,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        for attempt in range(5):
            self.port = free_port()
            conf = dict(self.settings, port=str(self.port), unix_socket_directories=f"'{self.root}'")
            with open(self.datadir / "postgresql.auto.conf", "w") as f:
                f.writelines(f"{k} = {v}\n" for k, v in conf.items())
            with open(self.datadir / "pg_hba.conf", "a") as f:
                f.write("host replication all 127.0.0.1/32 trust\n")
            proc = self._run(
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.root / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
                check=False,
            )
            if proc.returncode == 0:
                return self
            if attempt == 4:
                raise MirrorlineError(f"PostgreSQL did not start: {self.log_tail()}")
        return self

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join((self.root / "server.log").read_text().splitlines()[-n:])  # type: ignore[operator]
        except OSError:
            return "(no server log)"

    def stop(self, mode: str = "immediate") -> None:
        if self.root is None:
            return
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def restart(self) -> None:
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self.root / "server.log"),  # type: ignore[operator]
            "-m",
            "fast",
            "-w",
            "restart",
        )

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={dbname}"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def bin(self, name: str) -> str:
        return str(self.bindir / name)

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        import psycopg2

        conn = psycopg2.connect(self.dsn(dbname))
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def create_database(self, name: str) -> str:
        self.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        for (slot,) in self.execute(f"SELECT slot_name FROM pg_replication_slots WHERE database = '{name}'"):
            with contextlib.suppress(Exception):
                self.execute(
                    f"SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    f"WHERE slot_name = '{slot}' AND active_pid IS NOT NULL"
                )
                time.sleep(0.1)
                self.execute(f"SELECT pg_drop_replication_slot('{slot}')")
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def cluster(settings: Mapping[str, str] | None = None) -> Iterator[PgCluster]:
    with PgCluster(settings) as c:
        yield c
