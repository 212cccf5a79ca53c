from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mirrorline.position import SEQ_MAX, Position, format_lsn, parse_lsn


def test_lsn_prints_as_postgresql_does():
    assert format_lsn(0x16B374D848) == "16/B374D848"
    assert format_lsn(0) == "0/0"
    assert parse_lsn("16/B374D848") == 0x16B374D848


def test_position_prints_lsn_and_sequence():
    assert str(Position(0x16B374D848, 3)) == "16/B374D848:3"
    assert Position.parse("16/B374D848:3") == Position(0x16B374D848, 3)
    assert Position.parse("16/B374D848") == Position(0x16B374D848, 0)


def test_the_end_of_a_transaction_prints_as_end():
    """A unit's end or a snapshot's point (after every change of its transaction) prints without the sentinel
    sequence; the sentinel's digits, as earlier versions wrote them, are still read."""
    assert str(Position(0x70F4CBF, SEQ_MAX)) == "0/70F4CBF:end"
    assert Position.parse("0/70F4CBF:end") == Position(0x70F4CBF, SEQ_MAX)
    assert Position.parse(f"0/70F4CBF:{SEQ_MAX}") == Position(0x70F4CBF, SEQ_MAX)


def test_positions_order_by_commit_lsn_then_sequence():
    assert Position(5, 9) < Position(6, 0) < Position(6, 1)
    assert sorted([Position(6, 1), Position(5, 9), Position(6, 0)]) == [Position(5, 9), Position(6, 0), Position(6, 1)]


@pytest.mark.parametrize("bad", ["", "16", "16/", "/B3", "G/1", "16/B374D848:x", "123456789/0"])
def test_malformed_positions_are_refused(bad):
    with pytest.raises(ValueError):
        Position.parse(bad)


@given(st.integers(0, 2**64 - 1), st.one_of(st.integers(0, 2**31), st.just(SEQ_MAX)))
def test_position_text_round_trips(lsn, seq):
    assert Position.parse(str(Position(lsn, seq))) == Position(lsn, seq)
