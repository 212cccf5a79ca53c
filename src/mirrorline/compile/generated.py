"""Generated units of work in the log row layout, for the compile benchmark (``bench/compile.py``): valid histories
built with numpy and Arrow (10 million changes in seconds), never with a Python loop per change.

Each key lives in one of the tables and goes through a valid history: a key that exists before the unit is updated
(mostly) or deleted; a key that does not is inserted, then updated or deleted; a deleted key may be inserted again.
Some updates mark the ``note`` column unchanged (an unchanged TOASTed value that was not sent), a few rename their
key to a fresh one (a key change). Ops of different keys interleave at random in log order; any prefix of the log is
again a valid unit, which is how the exact size is reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.log.rows import ARROW_SCHEMA

TABLES = ("public.orders", "public.customers", "public.order_lines")
COLUMNS = ("id", "name", "qty", "note")


@dataclass(frozen=True)
class Mix:
    changes_per_key: float = 5.0
    existing: float = 0.6  # share of keys already present before the unit
    delete: float = 0.12  # chance that an op on a present row is a delete (else an update)
    unchanged: float = 0.1  # chance that an update does not send ``note`` (unchanged TOAST)
    key_change: float = 0.005  # chance that a key's last update renames its key
    table_weights: tuple[float, ...] = (0.5, 0.3, 0.2)


def generate(changes: int, *, seed: int = 0, mix: Mix = Mix(), first_lsn: int = 0x1_0000_0000) -> pa.Table:
    """``changes`` changes (exactly) in log order, as an Arrow table with :data:`ARROW_SCHEMA`."""
    rng = np.random.default_rng(seed)
    n_keys = max(1, int(changes / mix.changes_per_key * 1.1) + 8)
    lengths = np.minimum(1 + rng.poisson(mix.changes_per_key - 1, n_keys), 4 * int(mix.changes_per_key) + 4)
    table_of_key = rng.choice(len(TABLES), n_keys, p=np.array(mix.table_weights) / sum(mix.table_weights))

    # ops key-major: key k's ops are rows starts[k] .. starts[k] + lengths[k] - 1, in step order
    total = int(lengths.sum())
    key_of_op = np.repeat(np.arange(n_keys), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    step = np.arange(total) - np.repeat(starts, lengths)
    kind = np.empty(total, dtype="<U1")
    present = rng.random(n_keys) < mix.existing
    for j in range(int(lengths.max())):
        live = np.nonzero(lengths > j)[0]
        rows = starts[live] + j
        deleting = rng.random(live.size) < mix.delete
        kind[rows] = np.where(present[live], np.where(deleting, "D", "U"), "I")
        present[live] = np.where(present[live], ~deleting, True)
    is_u = kind == "U"
    unchanged = is_u & (rng.random(total) < mix.unchanged)
    # a key change: the key's last op, an update, renames the row to a fresh key of its own
    last_rows = starts + lengths - 1
    renamed = is_u[last_rows] & (rng.random(n_keys) < mix.key_change)
    new_key = key_of_op.copy()
    old_key = np.full(total, -1)
    rn_rows = last_rows[renamed]
    old_key[rn_rows] = key_of_op[rn_rows]
    new_key[rn_rows] = n_keys + np.arange(rn_rows.size)

    # log order: random times, sorted within each key, then all ops by time; cut to the size asked for
    t = rng.random(total)
    t = t[np.lexsort((t, key_of_op))]
    order = np.argsort(t, kind="stable")[:changes]
    n = order.size
    kind, key_id, old_id, unch = kind[order], new_key[order], old_key[order], unchanged[order]
    table_ids = table_of_key[key_of_op[order]]
    step_o = step[order]

    txn = np.arange(n) // 8  # transactions of 8 changes
    lsn = first_lsn + txn * 4096
    seq = np.arange(n) % 8

    key_str = pc.cast(pa.array(key_id), pa.string())
    key_col = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), key_str)
    has_old = old_id >= 0
    old_offsets = np.concatenate([[0], np.cumsum(has_old)]).astype(np.int32)
    old_col = pa.ListArray.from_arrays(
        pa.array(old_offsets),
        pc.cast(pa.array(old_id[has_old]), pa.string()),
        mask=pa.array(~has_old),
    )

    # images: id, name, qty, note (note absent when marked unchanged); none for D
    has_img = kind != "D"
    per_col = np.stack([has_img, has_img, has_img, has_img & ~unch])  # (4, n)
    counts = per_col.sum(axis=0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    entry_src = (np.arange(4)[:, None] * n + np.arange(n)[None, :]).T[per_col.T]  # row-major, present entries
    name = pc.binary_join_element_wise("customer ", pc.cast(pa.array(rng.integers(0, 100_000, n)), pa.string()), "")
    qty = pc.cast(pa.array(rng.integers(0, 1000, n) + step_o), pa.string())
    note = pc.binary_join_element_wise(
        "note ", pc.cast(pa.array(rng.integers(0, 1 << 30, n)), pa.string()), " " + "x" * 40, ""
    )
    values = pa.concat_arrays([key_str, name, qty, note]).take(pa.array(entry_src))
    keys = pa.array(COLUMNS).take(pa.array(entry_src // n))
    new_col = pa.MapArray.from_arrays(pa.array(offsets), keys, values, mask=pa.array(~has_img))
    unch_offsets = np.concatenate([[0], np.cumsum(unch)]).astype(np.int32)
    unch_col = pa.ListArray.from_arrays(pa.array(unch_offsets), pa.array(np.full(int(unch.sum()), "note")))

    return pa.Table.from_arrays(
        [
            pa.array(lsn, pa.int64()),
            pa.array(seq, pa.int64()),
            pa.array(1_700_000_000_000_000 + txn * 1000, pa.int64()),
            pa.array(1000 + txn, pa.int64()),
            pa.array(TABLES).take(pa.array(table_ids)),
            pa.array(kind.astype(object), pa.string()),
            key_col,
            old_col,
            new_col,
            unch_col,
            pa.array(np.ones(n, dtype=np.int32)),
        ],
        schema=ARROW_SCHEMA,
    )
