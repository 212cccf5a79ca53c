"""Capture killed with SIGKILL at random moments while a workload runs (ordinary, streamed, aborted and
savepoint transactions), restarted each time: the log then holds every committed change exactly once, in commit
order, compared against the history the workload itself recorded."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import Any

import configs
import psycopg2
import pytest
from waiting import wait_until

from mirrorline.log.reader import ChangeLog

# its own time limit, about three times what each test takes on 2 cores (the suite's is 900 s)
pytestmark = [pytest.mark.pg, pytest.mark.slow, pytest.mark.timeout(600)]

KILLS = 12


class Workload(threading.Thread):
    """One connection, so commit order is the order of its commits. ``history``: per committed transaction, the
    multiset of (op, id, v) it made."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.history: list[Counter[tuple[str, int, str | None]]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.next_id = 1
        self.live: list[int] = []

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            with conn.cursor() as cur:
                n = 0
                while not self.stop.is_set():
                    n += 1
                    self.one(conn, cur, n)
                    time.sleep(0.01 + self.rng.random() * 0.04)
            conn.close()
        except BaseException as e:  # pragma: no cover - reported by the test
            self.error = e

    def insert(self, cur: Any, k: int, count: int, pad: int = 5) -> Counter[tuple[str, int, str | None]]:
        lo = self.next_id
        self.next_id += count
        cur.execute(
            "INSERT INTO work SELECT g, %s, repeat('p', %s) FROM generate_series(%s, %s) g",
            (k, pad, lo, lo + count - 1),
        )
        return Counter(("I", i, str(k)) for i in range(lo, lo + count))

    def one(self, conn: Any, cur: Any, k: int) -> None:
        r = self.rng.random()
        made: Counter[tuple[str, int, str | None]] = Counter()
        new_ids: list[int] = []
        gone: set[int] = set()
        if r < 0.06:  # large: streamed with logical_decoding_work_mem = 64kB
            made += self.insert(cur, k, 1500, pad=40)
            new_ids = [i for (_, i, _) in made]
        elif r < 0.10:  # large, then rolled back
            self.insert(cur, k, 1500, pad=40)
            conn.rollback()
            return
        elif r < 0.14:  # a savepoint rolled back after a large part of it was streamed
            made += self.insert(cur, k, 5)
            cur.execute("SAVEPOINT s")
            self.insert(cur, k, 1200, pad=40)
            cur.execute("ROLLBACK TO SAVEPOINT s")
            made += self.insert(cur, k, 3)
            new_ids = [i for (_, i, _) in made]
        else:
            made += self.insert(cur, k, self.rng.randint(1, 20))
            new_ids = [i for (_, i, _) in made]
            if self.live and self.rng.random() < 0.5:
                ids = self.rng.sample(self.live, min(len(self.live), self.rng.randint(1, 8)))
                cur.execute("UPDATE work SET v = %s WHERE id = ANY(%s)", (k, ids))
                made += Counter(("U", i, str(k)) for i in ids)
            if len(self.live) > 20 and self.rng.random() < 0.3:
                ids = self.rng.sample(self.live, 3)
                cur.execute("DELETE FROM work WHERE id = ANY(%s)", (ids,))
                made += Counter(("D", i, None) for i in ids)
                gone = set(ids)
        conn.commit()
        self.history.append(made)
        self.live = [i for i in self.live if i not in gone] + new_ids


def start_capture(cfg: Path, once: bool = False) -> subprocess.Popen[bytes]:
    err = cfg.parent / f"capture-{time.monotonic_ns()}.err"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mirrorline.cli.main", "capture", *(["--once"] if once else []), "-c", str(cfg)],
        stderr=err.open("wb"),
    )
    proc.err_path = err  # type: ignore[attr-defined]
    return proc


def stderr_of(proc: subprocess.Popen[bytes]) -> str:
    return str(proc.err_path.read_text())  # type: ignore[attr-defined]


def wait_ready(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until capture says it is streaming (or has died)."""

    def capturing() -> bool:
        if "capturing" in stderr_of(proc):
            return True
        if proc.poll() is not None:
            raise AssertionError(f"capture exited {proc.returncode}: {stderr_of(proc)}")
        return False

    wait_until(capturing, timeout=timeout, interval=0.05, what="capture starts", context=lambda: stderr_of(proc))


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(pg_cluster_factory: Any, tmp_path: Path) -> None:
    cluster = pg_cluster_factory(logical_decoding_work_mem="64kB")
    cluster.execute("CREATE TABLE work (id bigint PRIMARY KEY, v int NOT NULL, pad text)")
    cfg = configs.write(
        tmp_path / "mirrorline.toml",
        source=cluster.dsn(),
        log={"path": "log", "segment_changes": 2000, "segment_seconds": "200ms"},
        tables=["public.work"],
    )
    seed = int(os.environ.get("MIRRORLINE_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    first = start_capture(cfg)
    wait_ready(first)  # publication and slot exist before the workload starts
    work = Workload(cluster.dsn(), seed)
    work.start()
    proc = first
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.2, 2.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert proc.returncode == -signal.SIGKILL, f"capture died by itself (seed {seed})"
            t0 = time.monotonic()
            proc = start_capture(cfg)
            wait_ready(proc)
            print(f"restart took {time.monotonic() - t0:.1f}s; {len(work.history)} transactions so far")
    finally:
        work.stop.set()
        work.join(60)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert work.error is None, work.error
    final = start_capture(cfg, once=True)
    assert final.wait(300) == 0, stderr_of(final)

    log = ChangeLog(tmp_path / "log")
    got = list(log.read())
    positions = [c.pos for c in got]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), f"seed {seed}"
    txns = [
        Counter((c.op.value, int(c.key[0]), c.new["v"] if c.new is not None else None) for c in group)
        for _, group in groupby(got, key=lambda c: c.pos.lsn)
    ]
    expected = [t for t in work.history if t]
    assert len(txns) == len(expected), f"seed {seed}: {len(txns)} transactions in the log, {len(expected)} committed"
    for i, (have, want) in enumerate(zip(txns, expected, strict=True)):
        assert have == want, f"seed {seed}: transaction {i} differs"
    assert not list((tmp_path / "log" / "spill").iterdir())
    assert sum(sum(t.values()) >= 1500 for t in expected) >= 1, "no large (streamed) transaction in the workload"
