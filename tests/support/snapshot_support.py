"""Helpers for the snapshot, status and verify tests: configurations, a source table of many types, a workload
that keeps changing it, capture into the log."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import configs
import psycopg2

from mirrorline import config as C

ITEMS_DDL = """
CREATE TABLE {name} (
  id bigint PRIMARY KEY, name text, qty integer, price numeric(10,2), flag boolean, f8 double precision,
  f4 real, ts timestamptz, d date, b bytea, j jsonb, note varchar(20)
)"""

ITEM_COLS = "id, name, qty, price, flag, f8, f4, ts, d, b, j, note"


def item_values(i: int, salt: int = 0) -> str:
    names = ["plain", "", "with, comma", 'quote "q"', "new\nline", "tab\there", "back\\slash", None]
    name = names[(i + salt) % len(names)]
    name_sql = "NULL" if name is None else "'" + name.replace("'", "''") + "'"
    f8 = [0.1, 1e15, 1.5e-5, -0.0, 123456789.125, 1e300][(i + salt) % 6]
    return (
        f"({i}, {name_sql}, {(i * 7 + salt) % 1000}, {((i + salt) % 100000) / 100:.2f}, "
        f"{'NULL' if i % 5 == 0 else ('true' if (i + salt) % 2 else 'false')}, {f8!r}, {(i % 97) / 7}, "
        f"timestamptz '2024-01-01 00:00:00+02' + interval '{i + salt} minutes 0.25 seconds', "
        f"date '2020-01-01' + {i % 400}, '\\x{(i + salt) % 65536:04x}'::bytea, "
        f'\'{{"k": {i}, "s": "v{salt}"}}\', \'n{i % 13}\')'
    )


def create_items(dsn: str, name: str = "public.items", rows: int = 2000, start: int = 1) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(ITEMS_DDL.format(name=name))
        if rows:
            cur.execute(
                f"INSERT INTO {name} ({ITEM_COLS}) VALUES "
                + ", ".join(item_values(i) for i in range(start, start + rows))
            )
    conn.close()


def write_config(
    tmp_path: Path,
    source_dsn: str,
    targets: Mapping[str, str | configs.Settings],
    tables: Mapping[str, configs.Settings],
    name: str = "mirrorline.toml",
    slot: str = "mirrorline",
    log: configs.Settings | None = None,
    **sections: Any,
) -> C.Config:
    """The snapshot, status and verify tests' configuration at ``tmp_path / name``, loaded: the log in ``log``
    beside it (with more settings ``log``), segments closed after 0.2 s, units after 0.5 s; ``targets``: name -> URL,
    or the target's settings; ``sections``: more of :func:`configs.text`'s (``metrics``, ``spark``)."""
    return configs.load(
        tmp_path / name,
        source={"dsn": source_dsn, "slot": slot},
        log={"path": "log", "segment_seconds": "0.2", **(log or {})},
        apply={"latency": "0.5s"},
        tables=tables,
        targets=targets,
        **sections,
    )


def target_urls(tmp_path: Path, pg_cluster: Any, kinds: list[str], created: list[str]) -> dict[str, str]:
    out = {}
    for k in kinds:
        if k == "postgresql":
            db = "tgt_" + uuid.uuid4().hex[:10]
            pg_cluster.create_database(db)
            created.append(db)
            out[k] = pg_cluster.url(db)
        else:
            out[k] = f"{k}:///{tmp_path / ('target.' + k)}"
    return out


class Workload:
    """Inserts, updates (some of the key) and deletes on a table, spread over the whole key range, in small
    transactions, until stopped."""

    def __init__(self, dsn: str, table: str = "public.items", max_id: int = 2000, seed: int = 1) -> None:
        self.dsn, self.table, self.next_id = dsn, table, max_id + 1
        self.max_id = max_id
        self.rng = random.Random(seed)
        self.ops = 0
        self.txns = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def step(self, cur: Any) -> None:
        r = self.rng.random()
        k = self.rng.randint(1, self.next_id)
        if r < 0.35:
            cur.execute(f"INSERT INTO {self.table} ({ITEM_COLS}) VALUES {item_values(self.next_id, 3)}")
            self.next_id += 1
        elif r < 0.75:
            cur.execute(
                f"UPDATE {self.table} SET qty = qty + 1, name = 'upd' || qty, f8 = f8 * 2, "
                f"ts = ts + interval '1 hour', flag = NOT flag WHERE id = %s",
                (k,),
            )
        elif r < 0.8:
            cur.execute(f"UPDATE {self.table} SET id = %s WHERE id = %s", (self.next_id, k))
            self.next_id += 1
        else:
            cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (k,))
        self.ops += 1

    def run_some(self, n: int) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cur:
                for _ in range(n):
                    self.step(cur)
                    if self.rng.random() < 0.3:
                        conn.commit()
                        self.txns += 1
            conn.commit()
        finally:
            conn.close()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.run_some(5)
                time.sleep(0.002)
        except BaseException as e:
            self.error = e

    def start(self) -> Workload:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error


def capture_once(cfg: C.Config) -> Any:
    from mirrorline.capture.session import Capture

    return Capture(cfg, once=True).run()


class CaptureThread:
    """``mirrorline capture`` running alongside, stopped on request."""

    def __init__(self, cfg: C.Config) -> None:
        from mirrorline.capture.session import Capture

        self.capture = Capture(cfg)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.capture.run()
        except BaseException as e:
            self.error = e

    def start(self) -> CaptureThread:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.capture.stop()
        self.thread.join(60)
        if self.error is not None:
            raise self.error


class RunnerThread(threading.Thread):
    """``mirrorline run`` (a :class:`~mirrorline.pipeline.Runner`) in a thread of its own; what it raised is kept in
    ``errors``."""

    def __init__(self, runner: Any) -> None:
        super().__init__(daemon=True)
        self.runner = runner
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            self.runner.run()
        except BaseException as e:
            self.errors.append(e)
