"""The fold of one key's ops as Spark SQL expression text (pure: no Spark needed to build it).

Each group row holds ``ops``: the key's ops sorted by position, structs of (lsn, seq, sub, kind, new, unchanged),
and the flags ``si`` (an I on a present row is an error: D is in the table's actions), ``su`` (a U or D on an absent
row is an error: I is in the actions), ``e`` (a TRUNCATE emptied the table before these ops, at ``tlsn``/``tseq``)
and ``last_epoch`` (no TRUNCATE after them). :data:`FOLD_STEPS` adds, in order, one column each; the last, ``rows``,
is the key's net rows (kind D, U, I; or one E row carrying ``err`` when the sequence is invalid).

:func:`fold_steps` with ``moves`` (the unit has key changes not sending some columns) adds what resolving those needs
(see :mod:`mirrorline.compile.spark`): the group's ``allops`` may hold ``d`` ops (the D of such a key change when the
table's actions drop D: not folded, but the new key still needs the old row's values) and ``hm`` is true when one
of its ops is the D of such a key change; the net rows gain
``moved_from``, ``plsn`` and ``pseq`` (for an I whose image came from a key change and still marks columns: that
change's position), and each such key change's D adds one ``H`` row (a *handoff*, at the change's position): ``new``
holds the latest values the old key's row had in the unit for the columns not sent, ``unchanged`` the columns it
never saw, ``moved_from`` the old key when the row was there before the unit, or ``plsn``/``pseq`` the key change
that brought the row to the old key (a chain: resolved later by joining handoffs), or neither (no source).
"""

from __future__ import annotations

_NET_ROW = "STRUCT<kind: STRING, new: MAP<STRING, STRING>, unchanged: ARRAY<STRING>, lsn: BIGINT, seq: BIGINT>"

# The ops of a key sorted by position. They arrive sorted (the aggregate streams over rows sorted by key and position),
# which a native comparison confirms cheaply; the lambda sort (maps are not orderable, so no plain sort) is a safety.
SORTED_OPS = (
    "CASE WHEN sort_array(arrays_zip(ops.lsn, ops.seq, ops.sub)) = arrays_zip(ops.lsn, ops.seq, ops.sub) THEN ops "
    "ELSE array_sort(ops, (a, b) -> CASE WHEN a.lsn <> b.lsn THEN IF(a.lsn < b.lsn, -1, 1) "
    "WHEN a.seq <> b.seq THEN IF(a.seq < b.seq, -1, 1) ELSE a.sub - b.sub END) END"
)

_NET_ROW_MOVES = (
    "STRUCT<kind: STRING, new: MAP<STRING, STRING>, unchanged: ARRAY<STRING>, lsn: BIGINT, seq: BIGINT, "
    "moved_from: ARRAY<STRING>, plsn: BIGINT, pseq: BIGINT>"
)
_NULL_MOVE = "'moved_from', CAST(NULL AS ARRAY<STRING>), 'plsn', CAST(NULL AS BIGINT), 'pseq', CAST(NULL AS BIGINT)"
# the last I when it came from a key change and the image still marks columns: the change whose handoff fills them
_I_MOVE = (
    "'moved_from', CAST(NULL AS ARRAY<STRING>), "
    "'plsn', CASE WHEN size(image.unchanged) > 0 AND last_i > 0 AND get(ops, last_i - 1).sub = 1 "
    "THEN get(ops, last_i - 1).lsn END, "
    "'pseq', CASE WHEN size(image.unchanged) > 0 AND last_i > 0 AND get(ops, last_i - 1).sub = 1 "
    "THEN get(ops, last_i - 1).seq END"
)


# The handoffs of the group's key changes (D of a change that marks columns, ``new`` set: a plain D has none), over
# ``allops``, in the groups whose ``hm`` says they hold one (most groups of such a unit hold none, and are spared
# building and filtering an index array: bench/compile.py): per such D at (1-based) index j, the last I before it
# (li, 0: none) and the I and U ops in between (a valid history has no D there), then for each column not sent the
# nearest of those ops that sent it.
def handoff_op(op: str) -> str:
    """Is the op ``op`` (an expression of the ops' struct) the D of a key change that marks columns: the one test both
    the aggregate's ``hm`` and the step ``hj`` make."""
    return f"{op}.kind IN ('D', 'd') AND {op}.new IS NOT NULL AND size({op}.unchanged) > 0"


_MOVE_STEPS: list[tuple[str, str]] = [
    (
        "hj",
        "CASE WHEN hm AND err IS NULL AND last_epoch THEN filter(sequence(1, size(allops)), j -> "
        f"{handoff_op('get(allops, j - 1)')}) END",
    ),
    (
        "hw",
        "transform(hj, j -> named_struct('j', j, 'li', coalesce(array_max(filter(sequence(1, j), "
        "i -> i < j AND get(allops, i - 1).kind = 'I')), 0)))",
    ),
    (
        "hf",
        "transform(hw, p -> named_struct('o', get(allops, p.j - 1), 'li', p.li, 'found', "
        "transform(get(allops, p.j - 1).unchanged, c -> named_struct('c', c, 'd', try_element_at(filter("
        "slice(allops, greatest(p.li, 1), p.j - greatest(p.li, 1)), "
        "x -> x.kind IN ('I', 'U') AND coalesce(map_contains_key(x.new, c), false)), -1)))))",
    ),
    (
        "hand",
        "transform(hf, h -> named_struct('kind', 'H', "
        "'new', map_from_entries(transform(filter(h.found, f -> f.d IS NOT NULL), "
        "f -> named_struct('key', f.c, 'value', try_element_at(f.d.new, f.c)))), "
        "'unchanged', transform(filter(h.found, f -> f.d IS NULL), f -> f.c), "
        "'lsn', h.o.lsn, 'seq', h.o.seq, "
        "'moved_from', CASE WHEN h.li = 0 THEN key END, "
        "'plsn', CASE WHEN h.li > 0 AND get(allops, h.li - 1).sub = 1 THEN get(allops, h.li - 1).lsn END, "
        "'pseq', CASE WHEN h.li > 0 AND get(allops, h.li - 1).sub = 1 THEN get(allops, h.li - 1).seq END))",
    ),
]


def fold_steps(moves: bool = False, bags: bool = False) -> list[tuple[str, str]]:
    """The fold's steps; ``moves``: with the handoffs of key changes that mark columns (see the module's notes);
    ``bags``: the unit has tables without a key (the group's ``bag`` is true for them, ``names`` their columns)."""
    if not moves:
        return _with_bags(FOLD_STEPS, "", _NET_ROW) if bags else FOLD_STEPS
    steps = [("allops", "ops"), ("ops", "CASE WHEN si THEN allops ELSE filter(allops, x -> x.kind <> 'd') END")]
    for name, sql in FOLD_STEPS[:-1]:
        steps.append((name, sql))
    steps += _MOVE_STEPS
    rows = _rows(", " + _NULL_MOVE, ", " + _I_MOVE, _NET_ROW_MOVES)
    none = f"CAST(array() AS ARRAY<{_NET_ROW_MOVES}>)"
    steps.append(("rows", f"concat({rows}, coalesce(CAST(hand AS ARRAY<{_NET_ROW_MOVES}>), {none}))"))
    return _with_bags(steps, ", " + _NULL_MOVE, _NET_ROW_MOVES) if bags else steps


def _with_bags(steps: list[tuple[str, str]], null_move: str, row_type: str) -> list[tuple[str, str]]:
    """The steps with a bag table's fold in front of the keyed one (see the rules in
    :mod:`mirrorline.compile.reference`): ``bn``, the copies the unit adds (I) less those it removes (D); after a
    TRUNCATE a count below zero is an error naming the first D; else ``|bn|`` rows of kind I (the image: the key's
    values) or D, at the position of the group's last op."""
    first_d = "get(filter(ops, o -> o.kind = 'D'), 0)"
    bag_err = (
        "CASE WHEN e AND bn < 0 THEN named_struct('first_op', 'T', 'first_lsn', tlsn, 'first_seq', tseq, "
        f"'second_op', 'D', 'second_lsn', {first_d}.lsn, 'second_seq', {first_d}.seq, 'second_sub', {first_d}.sub) "
        "END"
    )
    bag_rows = (
        f"CASE WHEN NOT last_epoch OR bn = 0 THEN CAST(array() AS ARRAY<{row_type}>) "
        f"ELSE CAST(transform(sequence(1, abs(bn)), i -> named_struct('kind', IF(bn > 0, 'I', 'D'), "
        "'new', IF(bn > 0, map_from_arrays(names, key), CAST(NULL AS MAP<STRING, STRING>)), "
        "'unchanged', CAST(array() AS ARRAY<STRING>), 'lsn', element_at(ops, -1).lsn, "
        f"'seq', element_at(ops, -1).seq{null_move})) AS ARRAY<{row_type}>) END"
    )
    out: list[tuple[str, str]] = [
        ("bn", "CASE WHEN bag THEN size(filter(ops, o -> o.kind = 'I')) - size(filter(ops, o -> o.kind = 'D')) END")
    ]
    for name, sql in steps:
        if name == "err":
            sql = f"CASE WHEN bag THEN {bag_err} ELSE {sql} END"
        elif name == "hj":
            sql = f"CASE WHEN NOT bag THEN {sql} END"
        elif name == "rows":
            sql = f"CASE WHEN bag AND err IS NULL THEN {bag_rows} ELSE {sql} END"
        out.append((name, sql))
    return out


def _rows(null_move: str, i_move: str, row_type: str) -> str:
    """The group's net rows; ``null_move`` and ``i_move`` add the fields of the moves layout (else empty)."""
    none = f"CAST(array() AS ARRAY<{row_type}>)"
    return (
        "CASE WHEN err IS NOT NULL THEN array(named_struct('kind', 'E', 'new', CAST(NULL AS MAP<STRING, STRING>), "
        f"'unchanged', CAST(array() AS ARRAY<STRING>), 'lsn', err.second_lsn, 'seq', err.second_seq{null_move})) "
        f"WHEN NOT last_epoch OR outk = '' THEN {none} "
        "WHEN outk = 'D' THEN array(named_struct('kind', 'D', 'new', CAST(NULL AS MAP<STRING, STRING>), "
        f"'unchanged', CAST(array() AS ARRAY<STRING>), 'lsn', last.lsn, 'seq', last.seq{null_move})) "
        "WHEN outk = 'R' THEN array(named_struct('kind', 'D', 'new', CAST(NULL AS MAP<STRING, STRING>), "
        f"'unchanged', CAST(array() AS ARRAY<STRING>), 'lsn', rem.lsn, 'seq', rem.seq{null_move}), "
        "named_struct('kind', 'I', 'new', image.new, 'unchanged', sort_array(image.unchanged), "
        f"'lsn', last.lsn, 'seq', last.seq{i_move})) "
        "ELSE array(named_struct('kind', outk, 'new', image.new, 'unchanged', sort_array(image.unchanged), "
        f"'lsn', last.lsn, 'seq', last.seq{i_move})) END"
    )


# Per (table, epoch, key) group, in order: each step may use the columns of the steps before it.
FOLD_STEPS: list[tuple[str, str]] = [
    ("n", "size(ops)"),
    ("s", "array_join(ops.kind, '')"),
    # the effective length: without I in the actions, ops after the row is gone (first D, or a TRUNCATE) are no-ops
    ("m", "CASE WHEN su THEN n WHEN e THEN 0 WHEN instr(s, 'D') > 0 THEN instr(s, 'D') ELSE n END"),
    ("sp", "substring(s, 1, m)"),
    (
        "bad",
        "CASE WHEN si AND su THEN regexp_instr(s, 'II|UI|DU|DD') WHEN si THEN regexp_instr(s, 'II|UI') "
        "WHEN su THEN regexp_instr(s, 'DU|DD') ELSE 0 END",
    ),
    (
        "err",
        "CASE WHEN e AND su AND substring(s, 1, 1) <> 'I' THEN named_struct('first_op', 'T', 'first_lsn', tlsn, "
        "'first_seq', tseq, 'second_op', get(ops, 0).kind, 'second_lsn', get(ops, 0).lsn, "
        "'second_seq', get(ops, 0).seq, 'second_sub', get(ops, 0).sub) "
        "WHEN bad > 0 THEN named_struct('first_op', get(ops, bad - 1).kind, 'first_lsn', get(ops, bad - 1).lsn, "
        "'first_seq', get(ops, bad - 1).seq, 'second_op', get(ops, bad).kind, 'second_lsn', get(ops, bad).lsn, "
        "'second_seq', get(ops, bad).seq, 'second_sub', get(ops, bad).sub) END",
    ),
    ("last", "get(ops, m - 1)"),
    ("last_i", "CASE WHEN instr(sp, 'I') > 0 THEN m - instr(reverse(sp), 'I') + 1 ELSE 0 END"),
    # was the row there before the unit: A(bsent), P(resent), M(aybe: without D a replica may keep a deleted row)
    (
        "before",
        "CASE WHEN e THEN 'A' WHEN substring(sp, 1, 1) = 'I' THEN (CASE WHEN si THEN 'A' ELSE 'M' END) ELSE 'P' END",
    ),
    (
        "outk",
        "CASE WHEN m = 0 THEN '' WHEN last.kind = 'D' THEN (CASE WHEN before = 'A' THEN '' ELSE 'D' END) "
        "WHEN before = 'A' THEN 'I' "
        "WHEN before = 'P' AND instr(sp, 'D') = 0 AND instr(substring(sp, 2), 'I') = 0 THEN 'U' ELSE 'R' END",
    ),
    # the D of a replace: the D right before the last I, else that I (it replaced the row itself)
    (
        "rem",
        "CASE WHEN outk <> 'R' THEN NULL WHEN last_i > 1 AND get(ops, last_i - 2).kind = 'D' "
        "THEN get(ops, last_i - 2) ELSE get(ops, last_i - 1) END",
    ),
    # the columns the last image marks unchanged: the latest value the row had before it in the unit (looking back,
    # from the last I on, for the nearest op that did not mark the column too), else they stay marked
    (
        "look",
        "CASE WHEN outk IN ('I', 'U', 'R') AND size(last.unchanged) > 0 AND greatest(last_i, 1) < m THEN "
        "transform(last.unchanged, c -> named_struct('c', c, 'd', try_element_at(filter("
        "slice(ops, greatest(last_i, 1), m - greatest(last_i, 1)), x -> NOT array_contains(x.unchanged, c)), -1))) "
        "END",
    ),
    (
        "image",
        "CASE WHEN outk NOT IN ('I', 'U', 'R') THEN NULL "
        "WHEN look IS NULL THEN named_struct('new', last.new, 'unchanged', last.unchanged) "
        "ELSE named_struct('new', map_concat(last.new, map_from_entries(transform("
        "filter(look, l -> coalesce(map_contains_key(l.d.new, l.c), false)), "
        "l -> named_struct('key', l.c, 'value', try_element_at(l.d.new, l.c))))), "
        "'unchanged', transform(filter(look, l -> NOT coalesce(map_contains_key(l.d.new, l.c), false)), l -> l.c)) "
        "END",
    ),
    ("rows", _rows("", "", _NET_ROW)),
]
