"""The fold of one key's ops as Spark SQL expression text (pure: no Spark needed to build it).

Each group row holds ``ops``: the key's ops sorted by position, structs of (lsn, seq, sub, kind, new, unchanged),
and the flags ``si`` (an I on a present row is an error: D is in the table's actions), ``su`` (a U or D on an absent
row is an error: I is in the actions), ``e`` (a TRUNCATE emptied the table before these ops, at ``tlsn``/``tseq``)
and ``last_epoch`` (no TRUNCATE after them). :data:`FOLD_STEPS` adds, in order, one column each; the last, ``rows``,
is the key's net rows (kind D, U, I; or one E row carrying ``err`` when the sequence is invalid).
"""

from __future__ import annotations

_NET_ROW = "STRUCT<kind: STRING, new: MAP<STRING, STRING>, unchanged: ARRAY<STRING>, lsn: BIGINT, seq: BIGINT>"
_NO_ROWS = f"CAST(array() AS ARRAY<{_NET_ROW}>)"

# The ops of a key sorted by position. They arrive sorted (the aggregate streams over rows sorted by key and position),
# which a native comparison confirms cheaply; the lambda sort (maps are not orderable, so no plain sort) is a safety.
SORTED_OPS = (
    "CASE WHEN sort_array(arrays_zip(ops.lsn, ops.seq, ops.sub)) = arrays_zip(ops.lsn, ops.seq, ops.sub) THEN ops "
    "ELSE array_sort(ops, (a, b) -> CASE WHEN a.lsn <> b.lsn THEN IF(a.lsn < b.lsn, -1, 1) "
    "WHEN a.seq <> b.seq THEN IF(a.seq < b.seq, -1, 1) ELSE a.sub - b.sub END) END"
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
    (
        "rows",
        "CASE WHEN err IS NOT NULL THEN array(named_struct('kind', 'E', 'new', CAST(NULL AS MAP<STRING, STRING>), "
        "'unchanged', CAST(array() AS ARRAY<STRING>), 'lsn', err.second_lsn, 'seq', err.second_seq)) "
        f"WHEN NOT last_epoch OR outk = '' THEN {_NO_ROWS} "
        "WHEN outk = 'D' THEN array(named_struct('kind', 'D', 'new', CAST(NULL AS MAP<STRING, STRING>), "
        "'unchanged', CAST(array() AS ARRAY<STRING>), 'lsn', last.lsn, 'seq', last.seq)) "
        "WHEN outk = 'R' THEN array(named_struct('kind', 'D', 'new', CAST(NULL AS MAP<STRING, STRING>), "
        "'unchanged', CAST(array() AS ARRAY<STRING>), 'lsn', rem.lsn, 'seq', rem.seq), "
        "named_struct('kind', 'I', 'new', image.new, 'unchanged', sort_array(image.unchanged), "
        "'lsn', last.lsn, 'seq', last.seq)) "
        "ELSE array(named_struct('kind', outk, 'new', image.new, 'unchanged', sort_array(image.unchanged), "
        "'lsn', last.lsn, 'seq', last.seq)) END",
    ),
]
