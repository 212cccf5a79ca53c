"""What one Spark task does with one chunk. Each task opens its own source connection, imports the exported
snapshot (``BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT ...``) and streams its chunk with COPY:

- :func:`pipe_chunk`: straight into a PostgreSQL target's table (``COPY ... TO STDOUT`` piped into ``COPY ... FROM
  STDIN``, no file, no Python-side parsing). The chunk is recorded in ``mirrorline_snapshot_chunks`` in the same
  transaction as its rows, so a task that Spark runs twice cannot load its rows twice.
- :func:`write_chunk`: into a chunk file (CSV after a one-line header naming export, table and chunk), written to a
  hidden name and renamed when complete, with its size and SHA-256.

Both report ``rewritten``: the table was rewritten (TRUNCATE, VACUUM FULL, CLUSTER, a rewriting ALTER TABLE) after the
snapshot and before the task read it. None of those is MVCC-safe: a snapshot reading such a table finds it empty (or
holding only what the rewrite kept), so the chunk is wrong and the snapshot must be taken again. The check runs in the
task's own transaction after its COPY, while the COPY's lock still keeps the table from being rewritten, so it is
exact: under the snapshot ``pg_class`` still names the file the snapshot saw, ``pg_relation_filenode`` the current one.

Specs are plain dicts so that they travel to executors as they are.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from mirrorline.model import quote_table
from mirrorline.snapshot.source import snapshot_connection

PIPE_BUFFER = 1 << 20

# the table's relations (itself, its partitions) whose file is no longer the one the snapshot knows
REWRITTEN_SQL = """
SELECT count(*) FROM (SELECT t.relid FROM pg_partition_tree(to_regclass(%(t)s)) t
                      UNION SELECT to_regclass(%(t)s)) p
JOIN pg_class c ON c.oid = p.relid
WHERE c.relkind IN ('r', 'm', 't') AND c.relfilenode IS DISTINCT FROM pg_relation_filenode(c.oid)
"""


def rewritten(cur: Any, table: str) -> bool:
    """In the transaction that read ``table`` under the snapshot (so holding its lock): was it rewritten after the
    snapshot?"""
    cur.execute(REWRITTEN_SQL, {"t": quote_table(table)})
    return int(cur.fetchone()[0]) > 0


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(PIPE_BUFFER):
            h.update(block)
    return h.hexdigest()


def pipe_chunk(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: source_dsn, snapshot, copy_out, target_dsn, copy_in, load_id, chunk_id, table, chunks_table (the
    target's own table of loaded chunks, qualified)."""
    import psycopg2

    src = snapshot_connection(spec["source_dsn"], spec["snapshot"])
    try:
        tgt = psycopg2.connect(spec["target_dsn"], application_name="mirrorline snapshot")
        try:
            tcur = tgt.cursor()
            tcur.execute("SET synchronous_commit = off")
            tcur.execute(
                f"INSERT INTO {spec['chunks_table']} (load_id, chunk, rows) VALUES (%s, %s, 0) ON CONFLICT DO NOTHING",
                (spec["load_id"], spec["chunk_id"]),
            )
            if tcur.rowcount == 0:  # this chunk was loaded by an earlier attempt of the task
                tgt.rollback()
                tcur.execute(
                    f"SELECT rows FROM {spec['chunks_table']} WHERE load_id = %s AND chunk = %s",
                    (spec["load_id"], spec["chunk_id"]),
                )
                return {
                    "table": spec["table"],
                    "chunk": spec["chunk_id"],
                    "rows": int(tcur.fetchone()[0]),
                    "again": True,
                    "rewritten": False,
                }  # committed: it passed the check
            rfd, wfd = os.pipe()
            reader = os.fdopen(rfd, "rb", buffering=PIPE_BUFFER)
            writer = os.fdopen(wfd, "wb", buffering=PIPE_BUFFER)
            failure: list[BaseException] = []

            def produce() -> None:
                try:
                    with src.cursor() as scur:
                        scur.copy_expert(spec["copy_out"], writer, size=PIPE_BUFFER)
                except BaseException as e:
                    failure.append(e)
                finally:
                    writer.close()

            t = threading.Thread(target=produce, name="snapshot-copy-out", daemon=True)
            t.start()
            try:
                tcur.copy_expert(spec["copy_in"], reader, size=PIPE_BUFFER)
            finally:
                reader.close()
                t.join()
            if failure:
                raise failure[0]
            rows = tcur.rowcount
            with src.cursor() as scur:
                if rewritten(scur, spec["table"]):  # the rows are wrong: keep none of them
                    tgt.rollback()
                    return {
                        "table": spec["table"],
                        "chunk": spec["chunk_id"],
                        "rows": 0,
                        "again": False,
                        "rewritten": True,
                    }
            tcur.execute(
                f"UPDATE {spec['chunks_table']} SET rows = %s WHERE load_id = %s AND chunk = %s",
                (rows, spec["load_id"], spec["chunk_id"]),
            )
            tgt.commit()
            return {"table": spec["table"], "chunk": spec["chunk_id"], "rows": rows, "again": False, "rewritten": False}
        finally:
            tgt.close()
    finally:
        src.close()


def write_chunk(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: source_dsn, snapshot, copy_out (CSV), path, header, table, chunk_id."""
    final = Path(spec["path"])
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.part")
    src = snapshot_connection(spec["source_dsn"], spec["snapshot"])
    try:
        with open(tmp, "wb", buffering=PIPE_BUFFER) as f:
            f.write(spec["header"].encode())
            with src.cursor() as cur:
                cur.copy_expert(spec["copy_out"], f, size=PIPE_BUFFER)
                rows = cur.rowcount
                again = rewritten(cur, spec["table"])
            f.flush()
            os.fsync(f.fileno())
        sha = file_sha256(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        src.close()
    return {
        "table": spec["table"],
        "chunk": spec["chunk_id"],
        "file": final.name,
        "rows": rows,
        "bytes": size,
        "sha256": sha,
        "rewritten": again,
    }
