"""Compile: one unit of work of the change log into net row changes (DESIGN §5).

- :mod:`mirrorline.compile.compiler`: the entry point, :class:`~mirrorline.compile.compiler.Compiler`: the route a
  unit takes (small, inserts, updates, general), chosen in one place.
- :mod:`mirrorline.compile.batch`: the output, :class:`~mirrorline.compile.batch.NetBatch` (the contract with apply).
- :mod:`mirrorline.compile.spark`: the general route, DataFrame of log rows in, NetBatch out.
- :mod:`mirrorline.compile.reference`: the same rules in plain Python, the oracle the compiler is tested against.
"""
