"""A Spark standalone cluster on this machine, started from PySpark's own ``spark-class``: one master and N workers
on 127.0.0.1, each worker with its own work directory and its cores. For tests and benchmarks (the harness starts it
and stops it whatever happens); production clusters are started by their own tooling."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SparkCluster:
    """``with SparkCluster(workers=2) as c: ... c.master ...`` (``spark://127.0.0.1:PORT``)."""

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        base: str | None = None,
        cpus: Sequence[set[int]] | None = None,
    ) -> None:
        """``cpus``: the CPUs each worker (and the executors it starts) may run on, one set per worker (default:
        any); a benchmark's way of giving each worker a core of its own on one machine."""
        self.workers, self.cores, self.memory = workers, cores, memory
        self.cpus = list(cpus) if cpus is not None else None
        self.dir = Path(tempfile.mkdtemp(prefix="mirrorline-spark-", dir=base))
        self.port = _free_port()
        self.master = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str, cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.dir / "logs"),
            "SPARK_WORKER_DIR": str(self.dir / name),
            "SPARK_NO_DAEMONIZE": "1",
        }
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            [str(spark_class()), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> SparkCluster:
        try:
            self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(_free_port()),
            )
            self._wait(self.dir / "master.log", r"I have been elected leader|Starting Spark master", "the master")
            for i in range(self.workers):
                work = self.dir / f"worker{i}-work"
                work.mkdir()
                self._start(
                    f"worker{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    self.master,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(work),
                    "--webui-port",
                    str(_free_port()),
                    cpus=self.cpus[i] if self.cpus else None,
                )
            for i in range(self.workers):
                self._wait(self.dir / f"worker{i}.log", r"Successfully registered with master", f"worker {i}")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, log: Path, pattern: str, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            if re.search(pattern, text):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise RuntimeError(f"Spark standalone {what} did not start: {tail}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self.cleanup()
