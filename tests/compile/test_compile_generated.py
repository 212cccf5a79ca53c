"""The generated units of work the compile benchmark and the demo's figures use (mirrorline.compile.generated)."""

from __future__ import annotations

from typing import Any

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
