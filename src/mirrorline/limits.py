"""The sizes at which mirrorline changes how it works, in one place. Each is a count of changes (or net rows, or bytes)
in one unit of work; each says where it is used, and why (with the benchmark that showed it, where one did).

- Unit sizing (``pipeline/plan.py``): a backlog below :data:`CATCH_UP_CHANGES` is applied in units of at
  most :data:`SMALL_UNIT` changes, a larger one in units of ``[apply] max_changes``.
- Compile routes (``compile/compiler.py``): a unit of at most :data:`SMALL_UNIT` changes compiles on the
  driver's prepared plan (``compile/small.py``); a unit of inserts only of at most :data:`INSERTS_MAX_ROWS` rows
  by the inserts route (``compile/inserts.py``); up to :data:`DRIVER_UNIT` changes the net rows come to the driver
  through Arrow in the fold's job, beyond it through Parquet (``compile/spark.py``).
- The inserts route's rows on the driver (``compile/batch.py``): at most :data:`FEED_BYTES` in memory.
- Slices of rows held at once (the driver's reads of the log, apply's loads of a worktable): at most
  :data:`LOAD_ROWS` rows and about :data:`SLICE_BYTES` bytes (:func:`slice_rows`), whatever the rows' width.
- Apply (``apply/engine.py``, ``apply/postgresql/target.py``): a unit of more than :data:`DRIVER_ROWS` changes is loaded
  table by table; a PostgreSQL target loads units of at least :data:`PARALLEL_ROWS` net rows into its worktables
  from Spark tasks.
"""

from __future__ import annotations

# the small route's unit: a plan prepared once on the driver, no job planning per unit (compile/small.py)
SMALL_UNIT = 50_000

# while Spark starts and warms up, a unit of at most this many changes is folded on the driver in plain Python
# (compile/driver.py): the first changes after a start need not wait for the JVM (bench/live's restart phase);
# a process that has not started Spark (apply --once, verify's catch-up) folds such units without ever starting it
FOLD_UNIT = 20_000

# a backlog at least this large is caught up in units of max_changes, a smaller one in units of SMALL_UNIT: under
# load the general route's many stages starve (bench/live unthrottled: a 209k-change unit compiled in 42 s and
# applied in 29 s while pgbench saturated the cores; units of 50,000 took 4 to 6 s), so only a large backlog takes it
CATCH_UP_CHANGES = 1_000_000

# net rows of larger units come back through Parquet rather than Arrow in the fold's job: a quarter of what the
# inserts route may hold on the driver (apply brings the rows to the driver table by table anyway)
DRIVER_UNIT = 1_000_000

# the inserts route holds the unit's rows in the driver's memory; larger units take the general route
INSERTS_MAX_ROWS = 4_000_000

# apply loads a unit of more changes than this table by table (bounded driver memory)
DRIVER_ROWS = 200_000

# a PostgreSQL target loads worktables of units of at least this many net rows from Spark tasks in parallel
PARALLEL_ROWS = 1_000_000

# an inserts route's rows of one unit held in the driver's memory while targets read them, in bytes (split among the
# unit's tables); past it the oldest are written to a scratch file that slower targets read back (compile/batch.py
# Feed): 1M rows of 2 kB inserted in one transaction would otherwise hold 2 GB (bench/bigtxn --tables wide)
FEED_BYTES = 64 << 20

# what a DuckDB target's database may hold in memory (its memory_limit, in bytes): DuckDB's default is 80% of the
# machine's, in run's own process (apply/duckdb/target.py). 128 MiB against 256: 1M rows of 2 kB inserted in one
# transaction applied in the same time (bench/bigtxn --tables wide --shapes insert: DuckDB's apply 59-64 s either
# way), run's peak PSS 1,585-1,604 MB -> 1,476-1,531; DuckDB alone, a 1M-row UPDATE .. FROM and DELETE .. USING
# as fast (0.3-0.4 s either way); in bench/bigtxn's update and delete shapes DuckDB had them 1.2-7.9 s after the
# commit at 128 MiB (the wide UPDATE 6.7-7.9 s; 9.0-9.4 s at 256 in runs of another day)
DUCKDB_MEMORY = 128 << 20

# bytes a SQLite target's WAL may hold before its next unit waits for the checkpoint that runs after each commit (off
# the commit path: apply/sqlite/checkpoint.py), so that the WAL starts again from its beginning
SQLITE_WAL_BYTES = 256 << 20

# the page size of a SQLite target's database file that mirrorline creates (an existing file keeps its own): SQLite
# writes a changed row's whole page to the WAL, and its default 4 kB page holds one 2 kB row where 16 kB hold seven.
# Measured: 1M updates of 2 kB rows in one transaction (bench/bigtxn --tables wide --shapes update) reach the SQLite
# target 17 s after the commit against 41.5 s with 4 kB pages (and the other targets, whose apply ahead waits for the
# slowest, 9-10 s against 21); under pgbench (bench/live, 300 and 1,000 tps) the lag and CPU are the same with both
SQLITE_PAGE_SIZE = 16384

# a worktable is loaded from the driver's Arrow rows a slice of this many rows at a time (SQLite's Python values,
# PostgreSQL's CSV text): what the load holds beside the rows is one slice's, whatever the unit's size
LOAD_ROWS = 65_536

# ... and of about this many bytes, whatever the rows' width (:func:`slice_rows`); so are the batches the driver
# reads from the log: 65,536 rows of 2 kB would be 128 MB a batch, and the inserts route's read, its feed and each
# target's load each hold one or more (bench/bigtxn --tables wide --shapes insert: run's peak memory)
SLICE_BYTES = 16 << 20

# a streamed transaction applied ahead of its commit (pipeline/ahead.py) is cut into parts at the end of a stream
# block once this many rows came since the last cut: each part is compiled once and applied by the unit's set-based
# statements at every target, so fewer, larger parts cost less; PostgreSQL sends a block each time the transaction's
# decoded changes pass logical_decoding_work_mem (64 MB by default), often more rows than this
AHEAD_ROWS = 50_000
# ... or once this many bytes of rows did (wide rows: a part's net rows are held until every target applied them)
AHEAD_BYTES = 16 << 20

# capture's walsender streams a large transaction in blocks of about this many bytes of decoded changes (its
# ``logical_decoding_work_mem``, lowered to this where the server's is larger): the first block of a big
# transaction comes after this much rather than after the server's default 64 MB
DECODING_MEMORY = 16 << 20


def slice_rows(nbytes: int, rows: int, max_rows: int | None = None, max_bytes: int | None = None) -> int:
    """How many rows of a table of ``rows`` rows and ``nbytes`` bytes one slice takes: at most ``max_rows``
    (default :data:`LOAD_ROWS`), and about ``max_bytes`` (default :data:`SLICE_BYTES`); at least one row."""
    max_rows = LOAD_ROWS if max_rows is None else max_rows
    max_bytes = SLICE_BYTES if max_bytes is None else max_bytes
    if rows <= 0 or nbytes <= max_bytes:
        return max(1, min(max_rows, rows))
    return max(1, min(max_rows, rows * max_bytes // nbytes))
