"""The registry of target kinds (mirrorline.apply.kinds): each row names a class that exists in the kind's own folder,
its capabilities reach the targets made of it, and the kind-parametrized tests cover every registered kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from mirrorline.apply import target_class
from mirrorline.apply.chunks import ChunkLoader
from mirrorline.apply.kinds import KINDS, by_scheme, compacting, load
from tests.support.apply_support import KINDS as TESTED_KINDS


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_is_one_folder_whose_class_bears_its_name(name: str) -> None:
    kind = KINDS[name]
    cls = target_class(name)
    assert cls.kind == name
    assert cls.__module__.startswith(f"mirrorline.apply.{name}.") or cls.__module__ == f"mirrorline.apply.{name}"
    for scheme in kind.schemes:
        assert by_scheme(scheme) is kind and by_scheme(scheme.upper()) is kind
    if kind.chunk_loader:
        loader = load(kind.chunk_loader)
        assert issubclass(loader, ChunkLoader)
        assert loader.__module__.startswith(f"mirrorline.apply.{name}.")


def test_the_kind_parametrized_tests_cover_every_registered_kind() -> None:
    assert sorted(p.values[0] for p in TESTED_KINDS) == sorted(KINDS)


def test_a_target_takes_its_capabilities_from_its_kind(tmp_path: Path) -> None:
    sqlite = target_class("sqlite")("s", str(tmp_path / "s.db"))
    duck = target_class("duckdb")("d", str(tmp_path / "d.duckdb"))
    assert (sqlite.open_wait, duck.open_wait) == (0.0, KINDS["duckdb"].open_wait) and duck.open_wait > 0
    assert target_class("duckdb")("d", str(tmp_path / "d.duckdb"), open_wait=0.0).open_wait == 0.0  # status's
    assert sqlite.chunk_loader() is None and duck.chunk_loader() is None  # the driver loads their chunks
    pg = target_class("postgresql")("p", "postgresql://nobody@127.0.0.1:1/none")  # made without connecting
    loader = pg.chunk_loader()
    assert loader is not None and type(loader) is load(KINDS["postgresql"].chunk_loader)
    assert compacting() == ["delta", "iceberg"]
