"""The compile demo (mirrorline.compile.demo.run_demo), in-process on the session's Spark, and the generated
workload it and the benchmark use."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from mirrorline.compile import generated
from mirrorline.compile.reference import fold, replay
from mirrorline.log.rows import table_to_changes


def test_workload_is_a_valid_unit_of_the_size_asked() -> None:
    unit = generated.generate(20_000, seed=3)
    assert unit.num_rows == 20_000 and unit.schema.equals(generated.ARROW_SCHEMA)
    changes = list(table_to_changes(unit))
    assert [c.pos for c in changes] == sorted(c.pos for c in changes)
    ops = {op: sum(c.op.value == op for c in changes) for op in "IUD"}
    assert all(n > 1000 for n in ops.values())
    assert any(c.old_key is not None for c in changes) and any(c.unchanged for c in changes)
    result = fold(changes)  # raises on an invalid sequence
    assert 3 < 20_000 / len(result.rows()) < 6
    assert len(result.tables) == 3


def test_workload_replays_from_the_state_it_assumes() -> None:
    changes = list(table_to_changes(generated.generate(3000, seed=5)))
    # keys whose first op is U or D existed before the unit
    state: dict[str, dict[Any, dict[str, Any]]] = {}
    seen: set[Any] = set()
    for c in changes:
        for key in [c.old_key, c.key] if c.old_key is not None else [c.key]:
            if (c.table, key) not in seen:
                seen.add((c.table, key))
                if c.op.value in "UD" and not (c.old_key is not None and key == c.key):
                    state.setdefault(c.table, {})[key] = {"id": key[0], "name": "n", "qty": "0", "note": "old"}
    replay(state, changes)


@pytest.mark.spark
def test_demo_prints_what_happened(spark: Any, tmp_path: Path) -> None:
    from mirrorline.compile.demo import run_demo

    out = io.StringIO()
    assert run_demo(4000, str(tmp_path), seed=2, out=out) == 0
    text = out.getvalue()
    expected = fold(table_to_changes(generated.generate(4000, seed=2)))
    net = len(expected.rows())
    assert re.search(rf"compiled 4,000 changes into {net:,} net row changes", text), text
    lines = [line.split() for line in text.splitlines() if line.startswith("  public.")]
    assert [w[0] for w in lines] == expected.tables
    for w in lines:
        t = expected.nets[w[0]]
        assert (w[1], w[3], w[5]) == (f"{len(t.deletes):,}", f"{len(t.updates):,}", f"{len(t.inserts):,}")
    assert pq.read_table(tmp_path / "net").num_rows == net
    assert pq.read_table(tmp_path / "log").num_rows == 4000


def test_demo_refuses_an_empty_workload() -> None:
    from mirrorline.compile.demo import run_demo
    from mirrorline.errors import UsageError

    with pytest.raises(UsageError):
        run_demo(0, None)
