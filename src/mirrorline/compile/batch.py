"""The output of compiling one unit of work: net row changes per table (DESIGN §5). The contract between compile and
apply; it does not depend on the target, so one compiled batch serves every target.

``net`` is a Spark DataFrame with one row per net change:

=============  ====================  ===========================================================================
column         type                  meaning
=============  ====================  ===========================================================================
table          string                "schema.name"
kind           string                "D" (delete this key), "U" (update to this image), "I" (insert this image)
key            array<string>         the key values, in the table's key-column order
new            map<string,string>    the image for U and I (null for D); columns marked unchanged are absent
unchanged      array<string>         columns not sent and not seen in the unit: for U, keep the target row's value;
                                     for I, take it from the target's row at ``moved_from``
lsn, seq       bigint, bigint        position of the last change folded into this net change
moved_from     array<string>         for an I whose ``unchanged`` is not empty: the key of the row, at the target
                                     as it is before the unit, that supplies those columns (a key-changing update
                                     whose TOASTed columns were not sent; the first key of a chain a->b->c); else
                                     null. Nullable: units stored before it existed read as null.
=============  ====================  ===========================================================================

A "replace" (delete then insert of one key) is two rows, kind D and kind I. Apply runs, per table in ``tables``
order: TRUNCATE if the table is in ``truncated``, then the deletes, then the updates, then the inserts; the
unchanged columns of the inserts are read from the rows at ``moved_from`` before the table's TRUNCATE and deletes (a
missing row there is an error, never a NULL). The "mirror" form of an update is a D and an I with ``moved_from`` =
its own key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mirrorline.position import Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NET_DDL = (
    "`table` STRING NOT NULL, kind STRING NOT NULL, key ARRAY<STRING> NOT NULL, new MAP<STRING, STRING>, "
    "unchanged ARRAY<STRING> NOT NULL, lsn BIGINT NOT NULL, seq BIGINT NOT NULL, moved_from ARRAY<STRING>"
)


@dataclass
class NetBatch:
    start: Position  # exclusive: the unit holds the changes after this position ...
    end: Position  # ... up to and including this one
    tables: list[str]  # every table with a change in the unit, in the order of its first change
    net: DataFrame
    truncated: dict[str, Position] = field(default_factory=dict)  # table -> position of its last TRUNCATE
    changes: int = 0  # how many log changes the unit held
    cached: DataFrame | None = field(default=None, repr=False)  # what ``net`` reads from, if it was cached
    scratch: str | None = field(default=None, repr=False)  # a local folder holding ``net``'s files, if temporary

    def of(self, table: str, kind: str) -> DataFrame:
        from pyspark.sql import functions as F

        return self.net.where((F.col("table") == table) & (F.col("kind") == kind))

    def counts(self) -> dict[str, dict[str, int]]:
        """``{table: {"D": n, "U": n, "I": n}}`` for every table in ``tables`` (one small Spark job)."""
        out = {t: {"D": 0, "U": 0, "I": 0} for t in self.tables}
        for r in self.net.groupBy("table", "kind").count().collect():
            out.setdefault(r["table"], {"D": 0, "U": 0, "I": 0})[r["kind"]] = int(r["count"])
        return out

    def release(self) -> None:
        """Free the net rows' cache or scratch files once every target has applied them (``net`` is unusable after)."""
        if self.cached is not None:
            self.cached.unpersist()
            self.cached = None
        if self.scratch is not None:
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
