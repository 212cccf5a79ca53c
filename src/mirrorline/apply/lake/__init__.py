"""What the table formats (Delta, Iceberg) share, each format's folder building on it: mirrorline's own state in a
SQLite file beside the tables, a unit's rows of a table checked against its current rows with DuckDB and committed as
one commit of the format carrying the unit's end, tables side by side in lanes, the failing net changes stopped at
or set aside, and verify's read as of the target's position.

Modules: ``dialect`` (PostgreSQL types as the format's, converted by DuckDB), ``plan`` (one table's checks and rows
to write), ``session`` (the state file, a snapshot's writes, verify's read), ``target`` (:class:`LakeTarget`, with the
methods a format implements).
"""
