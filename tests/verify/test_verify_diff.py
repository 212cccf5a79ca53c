"""verify --diff's pure core: buckets by key, and the rows of differing buckets matched by key."""

from __future__ import annotations

from mirrorline.verify.diff import BUCKETS, Buckets, bucket_of, compare, in_buckets

COLS = ["id", "name", "qty"]
SOURCE = [("1", "a", "10"), ("2", "b", "20"), ("3", "c", None), ("4", "d", "40")]


def test_a_difference_changes_only_its_keys_bucket() -> None:
    target = [("1", "a", "10"), ("2", "B", "20"), ("4", "d", "40"), ("5", "e", "50")]
    a, b = Buckets(), Buckets()
    a.add(SOURCE, [0])
    b.add(target, [0])
    assert int(a.count.sum()) == 4 and int(b.count.sum()) == 4
    assert a.differing(b) == {bucket_of([k]) for k in ("2", "3", "5")}
    again = Buckets.from_json(a.to_json())
    assert not again.differing(a)
    merged = Buckets()
    merged.merge(Buckets.from_json(a.to_json()))
    assert not merged.differing(a) and len(a.count) == BUCKETS


def test_rows_are_matched_by_key_and_report_the_columns_that_differ() -> None:
    target = [("1", "a", "10"), ("2", "B", "20"), ("4", "d", "40"), ("5", "e", None)]
    found, total = compare(SOURCE, target, COLS, [0], limit=10)
    assert total == 3
    assert [(d.kind, d.key, d.columns) for d in found] == [
        ("changed", ("2",), {"name": ("b", "B")}),
        ("missing", ("3",), {"name": ("c", None), "qty": (None, None)}),
        ("extra", ("5",), {"name": (None, "e"), "qty": (None, None)}),
    ]
    assert found[0].text(["id"]) == "changed id='2': name 'b' at the source, 'B' at the target"
    assert found[1].text(["id"]) == "missing id='3': name='c', qty=NULL"
    assert found[1].to_json() == {
        "kind": "missing",
        "key": ["3"],
        "columns": {"name": ["c", None], "qty": [None, None]},
    }
    assert compare(SOURCE, target, COLS, [0], limit=1) == (found[:1], 3)


def test_rows_without_a_key_are_a_multiset() -> None:
    every = [0, 1, 2]
    found, total = compare([("1", "x", "1"), ("1", "x", "1")], [("1", "x", "1")], COLS, every, limit=5)
    assert total == 1 and found[0].kind == "missing" and found[0].key == ("1", "x", "1")
    assert compare([("1", "x", "1")], [("1", "x", "1")], COLS, every, limit=5) == ([], 0)


def test_in_buckets_keeps_the_rows_of_the_wanted_buckets() -> None:
    wanted = {bucket_of(["2"]), bucket_of(["4"])}
    assert sorted(in_buckets(SOURCE, [0], wanted)) == [("2", "b", "20"), ("4", "d", "40")]
