"""The Spark side of a snapshot: the chunk tasks (:mod:`mirrorline.snapshot.tasks`) run as Spark jobs under a
consistent point, the chunk size and parallelism that the chunk plan is made for, the progress of a job, and the retry
when the source rewrites a table under the snapshot (a new consistent point, at most :data:`ATTEMPTS` times).

Over the wire, export (:mod:`mirrorline.snapshot.run`, :mod:`mirrorline.snapshot.files`) and ``verify`` run their
chunks through these.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mirrorline.config import Config
from mirrorline.errors import SnapshotError
from mirrorline.snapshot.plan import Chunk, TableStat, chunk_header, copy_out_sql
from mirrorline.snapshot.progress import Progress
from mirrorline.snapshot.source import ConsistentPoint
from mirrorline.sparkenv import get_spark

log = logging.getLogger("mirrorline.snapshot")

ATTEMPTS = 5  # consistent points tried when a table is rewritten between one and the read of its chunks


def run_tasks(
    fn: Callable[[dict[str, Any]], dict[str, Any]], specs: Sequence[dict[str, Any]], group: str, what: str
) -> list[dict[str, Any]]:
    """One Spark job: a task per spec (one partition each, in order)."""
    if not specs:
        return []

    sc = get_spark().sparkContext
    sc.setJobGroup(group, what, interruptOnCancel=True)
    try:
        return list(sc.parallelize(list(specs), len(specs)).map(fn).collect())
    except Exception as e:
        text = str(e).strip()
        reason = next((ln for ln in text.splitlines() if "Error" in ln and ":" in ln), text[:300])
        raise SnapshotError(
            f"{what} failed: {reason.strip()[:500]}",
            hint="nothing was marked loaded; fix the cause and run the snapshot again",
        ) from None


def spark_poll(group: str, total_rows: int, total_chunks: int) -> Callable[[Progress], None]:
    def poll(p: Progress) -> None:

        st = get_spark().sparkContext.statusTracker()
        done = 0
        for job in st.getJobIdsForGroup(group):
            info = st.getJobInfo(job)
            for sid in info.stageIds if info else ():
                stage = st.getStageInfo(sid)
                if stage:
                    done += stage.numCompletedTasks
        p.chunks = done
        if not p.exact:
            p.rows = total_rows * done // max(total_chunks, 1)  # an estimate until the tasks report

    return poll


def chunk_blocks(mb: float) -> int:
    """Heap blocks (8 kB) in a chunk of ``mb`` megabytes (at least one)."""
    return max(int(mb * (1 << 20) / 8192), 1)


def parallelism() -> int:

    return max(int(get_spark().sparkContext.defaultParallelism), 1)


def file_specs(
    config: Config, cp: ConsistentPoint, stats: dict[str, TableStat], chunks: list[Chunk], folder: Path, export_id: str
) -> list[dict[str, Any]]:
    """The specs of the tasks that write ``chunks`` as chunk files into ``folder``
    (:func:`~mirrorline.snapshot.tasks.write_chunk`)."""
    assert config.source is not None
    return [
        {
            "source_dsn": config.source.dsn,
            "snapshot": cp.snapshot,
            "table": c.table,
            "chunk_id": c.number,
            "copy_out": copy_out_sql(stats[c.table].schema, c, "csv"),
            "path": str(folder / c.file_name),
            "header": chunk_header(export_id, c),
        }
        for c in chunks
    ]


# ------------------------------------------------------------------------------------------------------ rewritten


class Rewritten(Exception):
    """A table was rewritten (TRUNCATE, ...) after the consistent point and before a task read it: the chunks read
    under that snapshot are wrong (see :mod:`mirrorline.snapshot.tasks`); take a new consistent point."""

    def __init__(self, tables: list[str]) -> None:
        super().__init__(", ".join(tables))
        self.tables = tables


def check_rewritten(results: Iterable[dict[str, Any]]) -> None:
    """Raise :class:`Rewritten` when a task reports that its table was rewritten under the snapshot."""
    bad = sorted({str(r["table"]) for r in results if r.get("rewritten")})
    if bad:
        raise Rewritten(bad)


def attempts(what: str) -> Iterator[int]:
    """Attempt numbers for an operation that a table rewritten under its snapshot restarts (the caller breaks out
    when an attempt succeeds); an error once they are used up."""
    yield from range(1, ATTEMPTS + 1)
    raise SnapshotError(
        f"{what}: the source rewrote a table (TRUNCATE, VACUUM FULL, CLUSTER or a rewriting ALTER "
        f"TABLE) after each of {ATTEMPTS} consistent points, before it was read; nothing was marked "
        "loaded",
        hint="run it again when the source is not truncating or rewriting the configured tables continually",
    )


def retrying(e: Rewritten, what: str, attempt: int) -> None:
    """Say that ``what`` takes a new consistent point after ``e``."""
    log.info(
        "%s: %s rewritten (TRUNCATE?) after the consistent point, before it was read; taking a new consistent "
        "point (attempt %d of %d)",
        what,
        ", ".join(e.tables),
        attempt,
        ATTEMPTS,
    )
