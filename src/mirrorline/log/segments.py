"""Reading and writing single segments: Parquet files (ordinary) and folders of parts (committed streams).

A segment's metadata (first/last position, count, timestamps, the previous segment's last position) travels with it:
in the Parquet footer of an ordinary segment, in ``commit.json`` of a stream folder. Both become visible with the
segment's atomic rename, so a reader never sees one without the other.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mirrorline import limits
from mirrorline.errors import LogError
from mirrorline.log.columns import ts_range, with_constants
from mirrorline.log.layout import (
    COMMIT_RECORD,
    META_KEY,
    SegmentInfo,
    fsync_path,
    publish,
    read_json,
    segment_name,
    temp_path,
)
from mirrorline.log.rows import ARROW_SCHEMA
from mirrorline.log.stats import Stats, merge, table_stats
from mirrorline.position import Position

ROW_GROUP_ROWS = 65_536
# Cheapest to write of the settings measured (bench/log_write.py), compact enough, and read by Spark everywhere.
WRITE_OPTIONS: dict[str, object] = {
    "compression": "snappy",
    "use_dictionary": False,
    "write_statistics": ["lsn", "seq", "ts"],
}


def open_parquet(path: Path) -> pq.ParquetWriter:
    return pq.ParquetWriter(str(path), ARROW_SCHEMA, **WRITE_OPTIONS)


def damaged(path: Path, reason: object) -> LogError:
    if isinstance(reason, OSError) and not path.exists():
        return LogError(
            f"change log segment {path} is gone: {reason}",
            hint="retention removes a segment once every registered target has applied it; a reader still needing "
            "it was behind them (reload its target: snapshot), or the file was deleted by hand",
            path=str(path),
        )
    return LogError(
        f"change log segment {path} is damaged: {reason}",
        hint="restore it from a backup, or rebuild the log from the source; the log is not usable past it",
        path=str(path),
    )


def write_segment(folder: Path, name: str, tables: Iterable[pa.Table], info: SegmentInfo) -> None:
    """Write an ordinary segment atomically: temp file, fsync, rename, fsync of the folder."""
    tmp = temp_path(folder, ".parquet")
    try:
        writer = open_parquet(tmp)
        try:
            for t in tables:
                writer.write_table(t, row_group_size=ROW_GROUP_ROWS)
            writer.add_key_value_metadata({META_KEY: json.dumps(info.meta()).encode()})
        finally:
            writer.close()
        fsync_path(tmp)
        publish(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_segment_stream(
    folder: Path,
    batches: Iterable[pa.Table],
    prev: Position | None,
    min_lsn: int,
    before_publish: Callable[[], None] | None = None,
    imported: Callable[[], tuple[int, int] | None] | None = None,
) -> SegmentInfo | None:
    """Stream whole transactions (final lsn/seq/ts, commit order, every lsn > ``min_lsn``) into one new segment.
    It becomes visible only when ``batches`` is exhausted without error (after ``before_publish``); None if empty.
    ``imported``: called once the batches are written, the address its metadata records (:attr:`SegmentInfo.imported`).
    """
    tmp = temp_path(folder, ".parquet")
    writer = open_parquet(tmp)
    first = last = None
    count, min_ts, max_ts = 0, None, None
    stats: Stats = {}
    try:
        try:
            for t in batches:
                if not t.num_rows:
                    continue
                lsn, seq = t.column("lsn"), t.column("seq")
                head = Position(lsn[0].as_py(), seq[0].as_py())
                if head.lsn <= (last.lsn if last is not None else min_lsn):
                    raise LogError(f"rows at {head} are not after the log's end", hint="a bug: please report it")
                first = first or head
                last = Position(lsn[-1].as_py(), seq[-1].as_py())
                lo, hi = ts_range(t)
                min_ts = lo if min_ts is None else min(min_ts, lo)
                max_ts = hi if max_ts is None else max(max_ts, hi)
                count += t.num_rows
                t = t.cast(ARROW_SCHEMA)
                stats = merge([stats, table_stats(t)])
                writer.write_table(t, row_group_size=ROW_GROUP_ROWS)
            if first is None or last is None or min_ts is None or max_ts is None:
                writer.close()
                tmp.unlink(missing_ok=True)
                return None
            name = segment_name(first.lsn, last.lsn)
            info = SegmentInfo(
                name=name,
                path=folder / name,
                stream=False,
                first=first,
                last=last,
                count=count,
                min_ts=min_ts,
                max_ts=max_ts,
                prev=prev,
                tables=stats,
                imported=imported() if imported is not None else None,
            )
            writer.add_key_value_metadata({META_KEY: json.dumps(info.meta()).encode()})
        finally:
            writer.close()
        fsync_path(tmp)
        if before_publish is not None:
            before_publish()
        publish(tmp, info.path)
        return info
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_info(path: Path) -> SegmentInfo:
    """A segment's metadata, from its footer or commit record. A damaged segment is a LogError."""
    name = path.name
    if name.endswith(".stream"):
        meta = read_json(path / COMMIT_RECORD)
        try:
            return SegmentInfo.from_meta(name, path, True, meta)
        except (KeyError, TypeError, ValueError) as e:
            raise damaged(path, f"bad commit record ({e})") from None
    try:
        md = pq.read_metadata(str(path))
        raw = (md.metadata or {}).get(META_KEY)
        if raw is None:
            raise damaged(path, "no mirrorline metadata in its footer")
        info = SegmentInfo.from_meta(name, path, False, json.loads(raw))
    except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as e:
        raise damaged(path, e) from None
    if md.num_rows != info.count:
        raise damaged(path, f"{md.num_rows} rows but its metadata says {info.count}")
    return info


def read_columns(info: SegmentInfo, columns: list[str]) -> pa.Table:
    """Some columns of a segment's rows, in log order (for lsn/seq/ts scans: a stream's constant lsn and ts are not
    read from disk)."""
    if not info.stream:
        try:
            t = pq.read_table(str(info.path), columns=columns)
        except (OSError, pa.ArrowException) as e:
            raise damaged(info.path, e) from None
        return t.cast(pa.schema([ARROW_SCHEMA.field(c) for c in columns]))
    stored = [c for c in columns if c not in ("lsn", "ts")]
    if "seq" not in stored:
        stored.append("seq")
    parts = []
    for p in info.parts:
        try:
            parts.append(pq.read_table(str(info.path / p), columns=stored))
        except (OSError, pa.ArrowException) as e:
            raise damaged(info.path / p, e) from None
    t = pa.concat_tables(parts).sort_by("seq") if parts else pa.table({c: [] for c in stored})
    n = t.num_rows
    out = {}
    for c in columns:
        if c == "lsn":
            out[c] = pa.array(np.full(n, info.first.lsn, dtype=np.int64))
        elif c == "ts":
            out[c] = pa.array(np.full(n, info.min_ts, dtype=np.int64))
        else:
            out[c] = t.column(c)
    return pa.table(out).cast(pa.schema([ARROW_SCHEMA.field(c) for c in columns]))


def iter_batches(info: SegmentInfo, batch_rows: int = 8192, batch_bytes: int | None = None) -> Iterator[pa.Table]:
    """A segment's rows in log order, a bounded batch at a time: at most ``batch_rows`` rows and about
    ``batch_bytes`` bytes (default :data:`~mirrorline.limits.SLICE_BYTES`; stream parts merged by seq)."""
    batch_bytes = limits.SLICE_BYTES if batch_bytes is None else batch_bytes
    if not info.stream:
        try:
            f = pq.ParquetFile(str(info.path))
            md = f.metadata
            groups = [md.row_group(i) for i in range(md.num_row_groups)]
            width = max((g.total_byte_size / g.num_rows for g in groups if g.num_rows), default=0.0)
            size = limits.slice_rows(int(width * batch_rows), batch_rows, batch_rows, batch_bytes)
            for b in f.iter_batches(batch_size=size):
                yield pa.Table.from_batches([b]).cast(ARROW_SCHEMA)
        except (OSError, pa.ArrowException) as e:
            raise damaged(info.path, e) from None
        return
    # A stream's parts each hold increasing seq, merged by seq (a part read once the merge reaches it).
    yield from merge_parts([info.path / p for p in info.parts], info.first.lsn, info.min_ts, batch_rows, batch_bytes)


def _part_batches(path: Path, lsn: int, ts: int, batch_rows: int, batch_bytes: int) -> Iterator[pa.Table]:
    """A part's rows a row group at a time, the file open only while a row group is read (a stream may have many
    parts: the merge must not hold a file handle per part)."""
    group = 0
    while True:
        try:
            with pq.ParquetFile(str(path)) as f:
                if group >= f.num_row_groups:
                    return
                t = f.read_row_group(group)
        except (OSError, pa.ArrowException) as e:
            raise damaged(path, e) from None
        group += 1
        t = with_constants(t.cast(ARROW_SCHEMA), lsn=lsn, ts=ts)
        step = limits.slice_rows(t.nbytes, t.num_rows, batch_rows, batch_bytes)
        for off in range(0, t.num_rows, step):
            yield t.slice(off, step)


def _first_seq(path: Path) -> int:
    """The first seq of a part, from its footer's statistics (a part's seqs increase); -1 where they say none."""
    try:
        md = pq.read_metadata(str(path))
    except (OSError, pa.ArrowException) as e:
        raise damaged(path, e) from None
    if md.num_row_groups == 0:
        return -1
    stats = md.row_group(0).column(md.schema.names.index("seq")).statistics
    return int(stats.min) if stats is not None and stats.has_min_max else -1


def merge_parts(paths: list[Path], lsn: int, ts: int, batch_rows: int, batch_bytes: int) -> Iterator[pa.Table]:
    """The rows of a stream's part files merged by seq (each part's seqs increase, so a heap of the parts' current
    heads gives log order), ``lsn`` and ``ts`` set, at most about ``batch_rows`` rows and ``batch_bytes`` a batch.

    A part is read once the merge reaches its first seq (its footer says it), so what is held is a row group of each
    part whose rows interleave with another's: one at a time where they follow one another, as the parts of a
    transaction without subtransactions do (76 parts of 2 kB rows left at a commit held 400 MB when every part's
    first row group was read at once: bench/bigtxn --tables wide --shapes insert)."""
    pending = sorted(((_first_seq(p), i) for i, p in enumerate(paths)), reverse=True)  # the next at the end
    iters: dict[int, Iterator[pa.Table]] = {}
    heads: list[tuple[int, int, pa.Table, int]] = []  # (seq of the head row, part index, batch, head row)

    def push(i: int) -> None:
        b = next(iters[i], None)
        if b is not None and b.num_rows:
            heapq.heappush(heads, (b.column("seq")[0].as_py(), i, b, 0))
        else:
            del iters[i]

    out: list[pa.Table] = []
    size = nbytes = 0
    while heads or pending:
        while pending and (not heads or pending[-1][0] < heads[0][0]):  # a part whose rows come before the heads'
            i = pending.pop()[1]
            iters[i] = _part_batches(paths[i], lsn, ts, batch_rows, batch_bytes)
            push(i)
        if not heads:
            continue
        _, i, b, r = heapq.heappop(heads)
        seqs = b.column("seq").to_numpy()
        # the run of this part's rows that come before every other part's head and every part not yet read
        bounds = [heads[0][0]] if heads else []
        if pending:
            bounds.append(pending[-1][0])
        end = len(seqs) if not bounds else r + int(np.searchsorted(seqs[r:], min(bounds)))
        end = max(end, r + 1)
        out.append(b.slice(r, end - r))
        size += end - r
        nbytes += out[-1].nbytes
        if end < b.num_rows:
            heapq.heappush(heads, (int(seqs[end]), i, b, end))
        else:
            push(i)
        if size >= batch_rows or nbytes >= batch_bytes:
            yield pa.concat_tables(out)
            out, size, nbytes = [], 0, 0
    if out:
        yield pa.concat_tables(out)


def fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        fsync_path(p)
    fsync_path(folder)


def remove_segment(path: Path) -> None:
    if path.is_dir():
        for p in path.iterdir():
            p.unlink(missing_ok=True)
        path.rmdir()
    else:
        path.unlink(missing_ok=True)


def remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for p in path.iterdir():
        if p.is_dir():
            remove_tree(p)
        else:
            p.unlink(missing_ok=True)
    os.rmdir(path)
