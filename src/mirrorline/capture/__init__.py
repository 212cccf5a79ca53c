"""Capture: the source PostgreSQL's changes, through logical decoding (pgoutput, large transactions streamed), into
the change log (DESIGN §3)."""
