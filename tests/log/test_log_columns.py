"""Images (``new`` maps) as one column per table column: :func:`mirrorline.log.columns.image_columns` is
``pyarrow.compute.map_lookup(..., "first")`` for every name at once, on any maps Arrow can hold."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorline.log.columns import image_columns

NAMES = ["id", "v", "pad", "é x"]
MAP_T = pa.map_(pa.string(), pa.string())
entries = st.lists(st.tuples(st.sampled_from([*NAMES, "other"]), st.none() | st.text(max_size=3)), max_size=6)
images = st.lists(st.none() | entries, max_size=40)


def _lookup(maps: pa.Array | pa.ChunkedArray, name: str) -> list[str | None]:
    return pc.map_lookup(maps, pa.scalar(name, pa.string()), "first").to_pylist()


@settings(max_examples=300)
@given(
    images,
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 3),
    st.lists(st.sampled_from(NAMES), max_size=4, unique=True),
)
def test_image_columns_are_map_lookup_of_each_name(
    rows: list[list[tuple[str, str | None]] | None], lo: int, length: int, chunks: int, names: list[str]
) -> None:
    """Nulls, empty maps, keys missing, repeated or not asked for, slices (whose offsets index the parent's
    entries) and chunked arrays."""
    maps: pa.Array | pa.ChunkedArray = pa.array(rows, MAP_T).slice(lo, length)
    if chunks:
        cut = [len(maps) * i // (chunks + 1) for i in range(chunks + 2)]
        maps = pa.chunked_array([maps.slice(a, b - a) for a, b in itertools.pairwise(cut)], MAP_T)
    got = image_columns(maps, names)
    assert list(got) == names
    for c in names:
        assert got[c].type == pa.string() and len(got[c]) == len(maps)
        assert got[c].to_pylist() == _lookup(maps, c), c


def test_a_null_map_with_entries_counts_for_nothing() -> None:
    """Arrow lets a null list slot span entries; they are not the row's values."""
    offsets = pa.array([0, 2, 3], pa.int32())
    keys, items = pa.array(["id", "v", "id"]), pa.array(["1", "2", "3"])
    maps = pa.MapArray.from_arrays(offsets, keys, items, mask=pa.array([True, False]))
    assert maps.to_pylist() == [None, [("id", "3")]]
    assert image_columns(maps, ["id", "v"]) == {"id": pa.array([None, "3"]), "v": pa.array([None, None], pa.string())}


def test_no_rows_and_no_names() -> None:
    empty = pa.array([], MAP_T)
    assert image_columns(empty, ["id"])["id"].to_pylist() == []
    assert image_columns(pa.array([[("id", "1")]], MAP_T), []) == {}
    assert image_columns(pa.chunked_array([], MAP_T), ["id"])["id"].to_pylist() == []
