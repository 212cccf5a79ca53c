"""What one Spark task does with one chunk. Each task opens its own source connection, imports the exported
snapshot (``BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT ...``) and streams its chunk with COPY:

- :func:`pipe_chunk`: straight into the target, for a kind that loads chunks from tasks (``Target.chunk_loader``): the
  ``COPY ... TO STDOUT`` piped into the kind's :class:`~mirrorline.apply.chunks.ChunkSink`, which commits the rows
  with a record of the chunk, so a task that Spark runs twice cannot load its rows twice.
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

from mirrorline.apply.chunks import open_sink
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
    """spec: source_dsn, snapshot, copy_out, table, chunk_id, sink ("module:function" of the target kind's
    :class:`~mirrorline.apply.chunks.ChunkSink`) and sink_spec (what it needs)."""

    out = {"table": spec["table"], "chunk": spec["chunk_id"], "rows": 0, "again": False, "rewritten": False}
    src = snapshot_connection(spec["source_dsn"], spec["snapshot"])
    try:
        sink = open_sink(spec["sink"], spec["sink_spec"])
        try:
            done = sink.begin()
            if done is not None:  # this chunk was loaded by an earlier attempt of the task
                return {**out, "rows": done, "again": True}
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
                rows = sink.copy_in(reader)
            finally:
                reader.close()
                t.join()
            if failure:
                raise failure[0]
            with src.cursor() as scur:
                if rewritten(scur, spec["table"]):  # the rows are wrong: keep none of them
                    sink.rollback()
                    return {**out, "rewritten": True}
            sink.commit(rows)
            return {**out, "rows": rows}
        finally:
            sink.close()
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
