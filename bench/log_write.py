"""Change-log write and read throughput. Prints ONE JSON line.

- write_changes_per_s: 1,000,000 generated changes (transactions of --txn changes) through LogWriter.add_transaction
  from Change objects (built before timing), segments of 100,000 changes, everything durable at the end.
- write_arrow_per_s: the same through add_transaction with one Arrow table per transaction.
- write_batch_per_s: the same through add_transactions with Arrow tables of --batch changes each holding many
  whole transactions (capture's path).
- anchor_parquet_per_s: the anchor: pyarrow writing the same rows as one Parquet file, no log logic.
- spark_read_per_s: read_spark over the whole log, aggregating every row (count, sum of map sizes, max lsn);
  anchor_spark_per_s: Spark reading one plain Parquet file of the same rows the same way.
- capture_overhead_background / _inline: a producer doing ~4.5 us of Python work per change (a bare pgoutput
  receiver's cost) hands batches to add_transactions; the time with the log writer divided by the producer alone
  (capture's budget is 1.25).
Medians of --repeat runs; ratios against the anchors.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mirrorline.log import ChangeLog, LogWriter, read_spark
from mirrorline.log.columns import changes_to_arrow, transactions_to_arrow
from mirrorline.model import Change, Op
from mirrorline.position import ZERO


def generate(n: int, txn: int) -> list[list[Change]]:
    ops = (Op.INSERT, Op.UPDATE, Op.UPDATE, Op.DELETE)
    txns: list[list[Change]] = []
    for t in range(0, n, txn):
        batch = []
        for i in range(t, min(t + txn, n)):
            op = ops[i % 4]
            new = None if op is Op.DELETE else {"id": str(i), "note": f"note {i}", "amount": "12.50", "qty": str(i % 7)}
            batch.append(Change(ZERO, 0, 1000 + t, "public.orders", op, (str(i),), new))
        txns.append(batch)
    return txns


BASE_LSN = 1 << 32
BASE_TS = 1_700_000_000_000_000


def write_log(root: Path, txns: list) -> float:
    t0 = time.perf_counter()
    with LogWriter(root, segment_changes=100_000) as w:
        for i, changes in enumerate(txns):
            w.add_transaction(BASE_LSN + i * 100, BASE_TS + i, changes)
        w.flush()
    return time.perf_counter() - t0


def write_batches(root: Path, batches: list[pa.Table], background: bool = True, work: int = 0) -> float:
    t0 = time.perf_counter()
    with LogWriter(root, segment_changes=100_000, background=background) as w:
        for b in batches:
            produce(work)
            w.add_transactions(b)
        w.flush()
    return time.perf_counter() - t0


def produce(work: int) -> None:
    """Pure-Python busy work standing in for receiving and decoding a batch."""
    x = 0
    for i in range(work):
        x += i


def calibrate(seconds_per_change: float, batch: int) -> int:
    t0 = time.perf_counter()
    produce(1_000_000)
    per_iter = (time.perf_counter() - t0) / 1_000_000
    return int(seconds_per_change * batch / per_iter)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--txn", type=int, default=10, help="changes per transaction")
    ap.add_argument("--batch", type=int, default=10_000, help="changes per add_transactions call")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    n = args.changes
    txns = generate(n, args.txn)
    arrow_txns = [changes_to_arrow(c, 0, 0) for c in txns]
    whole = transactions_to_arrow([(BASE_LSN + i * 100, BASE_TS + i, c) for i, c in enumerate(txns)])
    batches = []
    for off in range(0, n, args.batch):  # cut at transaction ends
        batches.append(whole.slice(off, args.batch).combine_chunks())
    tmp = Path(tempfile.mkdtemp(prefix="mirrorline-bench-"))
    results: dict[str, list[float]] = {
        "changes": [],
        "arrow": [],
        "batch": [],
        "anchor": [],
        "spark": [],
        "anchor_spark": [],
        "over_bg": [],
        "over_inline": [],
    }
    work = calibrate(4.5e-6, args.batch)
    try:
        for r in range(args.repeat):
            for kind, data in (("changes", txns), ("arrow", arrow_txns)):
                root = tmp / f"{kind}{r}"
                results[kind].append(n / write_log(root, data))
            results["batch"].append(n / write_batches(tmp / f"batch{r}", batches))
            t0 = time.perf_counter()
            for _ in batches:
                produce(work)
            alone = time.perf_counter() - t0
            results["over_bg"].append(write_batches(tmp / f"bg{r}", batches, True, work) / alone)
            results["over_inline"].append(write_batches(tmp / f"inl{r}", batches, False, work) / alone)
            t0 = time.perf_counter()
            pq.write_table(whole, str(tmp / f"anchor{r}.parquet"), compression="snappy")
            results["anchor"].append(n / (time.perf_counter() - t0))
        if not args.no_spark:
            from pyspark.sql import functions as F

            from mirrorline.sparkenv import get_spark

            spark = get_spark()
            log = ChangeLog(tmp / "changes0")

            def agg(df):  # type: ignore[no-untyped-def]
                return df.agg(F.count("*"), F.sum(F.size("new")), F.max("lsn")).collect()

            agg(read_spark(log, spark=spark))  # warm-up
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                agg(read_spark(log, ZERO, None, spark=spark))
                results["spark"].append(n / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                agg(spark.read.parquet(str(tmp / "anchor0.parquet")))
                results["anchor_spark"].append(n / (time.perf_counter() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items() if v}
    out = {
        "bench": "log_write",
        "changes": n,
        "txn_changes": args.txn,
        "write_changes_per_s": round(med["changes"]),
        "write_arrow_per_s": round(med["arrow"]),
        "write_batch_per_s": round(med["batch"]),
        "anchor_parquet_per_s": round(med["anchor"]),
        "write_vs_anchor": round(med["changes"] / med["anchor"], 3),
        "write_arrow_vs_anchor": round(med["arrow"] / med["anchor"], 3),
        "write_batch_vs_anchor": round(med["batch"] / med["anchor"], 3),
        "capture_overhead_background": round(med["over_bg"], 3),
        "capture_overhead_inline": round(med["over_inline"], 3),
    }
    if "spark" in med:
        out.update(
            {
                "spark_read_per_s": round(med["spark"]),
                "anchor_spark_per_s": round(med["anchor_spark"]),
                "spark_vs_anchor": round(med["spark"] / med["anchor_spark"], 3),
            }
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
