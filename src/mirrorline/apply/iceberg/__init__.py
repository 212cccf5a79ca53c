"""Apache Iceberg target: one Iceberg table per replicated table, written with pyiceberg (no JVM, no jars).

- The catalog: by default an embedded one, pyiceberg's SQL catalog in ``_catalog.sqlite`` in the target's folder
  with the tables' files under ``warehouse/`` beside it (nothing else running); or the catalog a ``[targets.X.catalog]``
  table names (a REST catalog: ``type = "rest"``, ``uri``, ``warehouse``, credentials), its properties passed to
  pyiceberg as they are, ``${NAME}`` in a value read from the environment and never printed.
- A table is named after the source's: namespace = schema, table = name, as they are (quotes, spaces, capitals,
  dots). Its files are under ``warehouse/<schema>/<name>`` with every character but letters, digits, ``_`` and ``-``
  written ``~`` and its bytes in hex. The table's property ``mirrorline.table`` names its source table.
- Each unit's net changes of a table are **one Iceberg commit**: one transaction deleting the rows in the unit's
  scope (the first key column's values it names, or ranges of them), writing back those of them whose key the unit
  does not remove, and appending the new images (an update's unsent columns taken from the row it updates), its
  snapshots' summaries holding ``mirrorline.target`` and ``mirrorline.position``, and the table's property
  ``mirrorline.position.<target>`` set to the unit's end in the same commit. A restart reads that property back: a
  table whose last commit holds the unit is skipped (exactly once per table). Tables are separate Iceberg tables: a
  reader may see one table a unit ahead of another. pyiceberg deletes copy-on-write: a data file holding a deleted
  row is written again without it (a unit whose keys are scattered over the table writes it again).
- mirrorline's own state (the unit end every table has reached, the snapshot state, rejects) lives in the target's
  folder in ``_mirrorline.sqlite``, as for every table format (:mod:`mirrorline.apply.lake`), which also checks each
  unit's rows against the table's current rows and converts the values with DuckDB.

Modules: ``dialect`` (Iceberg's types, a table's identifier, the catalog, positions), ``target`` (pyiceberg: the
commit of a unit, schema evolution, compaction, expiry and orphan files).
"""

from mirrorline.apply.iceberg.dialect import ICEBERG, IcebergDialect
from mirrorline.apply.iceberg.target import IcebergTarget

__all__ = ["ICEBERG", "IcebergDialect", "IcebergTarget"]
