"""Delta Lake target: one Delta table per replicated table under the target's folder, written with delta-rs (the
``deltalake`` package: no JVM, no jars).

- A table's folder is its name at the target (``public.orders`` -> ``orders``, ``sales.orders`` -> ``sales.orders``).
- Each unit's net changes of a table are **one Delta commit**: a MERGE (deletes; updates of only the columns that
  were sent; inserts; in ``mirror`` mode an update of a missing row inserts it), or, for a table the unit truncates,
  an overwrite. The commit carries the target's position: Delta's application transaction (``txn``) with app id =
  the target's name and version = the position's LSN, a second one ``<name>.seq`` with its sequence, and
  ``mirrorline.position`` in the commit's metadata. The table's position is read back from its ``txn`` versions
  (they survive checkpoints): a table whose last commit holds the unit is skipped after a crash (exactly once per
  table). Tables are separate Delta tables: a reader may see one table a unit ahead of another.
- mirrorline's own state (the unit end every table has reached, the snapshot state, rejects) lives beside them in
  ``_mirrorline.sqlite``, the same tables as on a SQLite target (:mod:`mirrorline.apply.state`). A table's own
  position is the later of its Delta ``txn`` and that file's.
- Values arrive as PostgreSQL's text and are converted by DuckDB's casts (in memory) into the Arrow types of the
  table (:meth:`DeltaDialect.type_info`). The checks a database's constraints make elsewhere (the row to delete or
  update exists, the key to insert does not) are made before the commit, against the table's current version: a
  failing net change stops the unit with nothing written, or (``on_error = "reject"``) is set aside in
  ``mirrorline_rejects`` as one row per net change (its key, kind and image, and the position of its last change).

What every table format shares (the state file, the checks of a unit's rows, lanes, rejects, verify's read) is in
:mod:`mirrorline.apply.lake`; here: ``dialect`` (Delta's type names, a table's folder, positions in commits) and
``target`` (delta-rs: the MERGE, schema changes, compaction and cleanup).
"""

from mirrorline.apply.delta.dialect import DELTA, DeltaDialect, commit_properties, table_position
from mirrorline.apply.delta.target import DeltaTarget

__all__ = ["DELTA", "DeltaDialect", "DeltaTarget", "commit_properties", "table_position"]
