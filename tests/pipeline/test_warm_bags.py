"""The small units' plan is built for the tables without a key (bags): ``run`` warms it up for those the log knows
and, for a new log, those the source's catalog has, so that the first units with their changes find it built (a
plan of their own took 10-14 s on a loaded machine: bench/live). What the catalog says is what the log then says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg2
import pytest
from snapshot_support import write_config

from mirrorline.capture.session import Capture
from mirrorline.pipeline import known_bags

pytestmark = [pytest.mark.pg]


def test_the_source_tells_the_tables_without_a_key_a_new_log_does_not_know_yet(pg: Any, tmp_path: Path) -> None:
    pg.execute(
        "CREATE TABLE public.keyed (id int PRIMARY KEY, v text);"
        'CREATE TABLE public."bag table" (a int, "b c" text, d numeric);'
        'ALTER TABLE public."bag table" REPLICA IDENTITY FULL;'
        "CREATE TABLE public.given (x int, y text);"
        "ALTER TABLE public.given REPLICA IDENTITY FULL;"
    )
    bag = "public.bag table"
    cfg = write_config(tmp_path, pg.dsn, {}, {"public.keyed": {}, bag: {}, "public.given": {"key": ["x"]}})
    conn = psycopg2.connect(pg.dsn)
    try:
        assert known_bags(cfg) == {}  # no log yet
        assert known_bags(cfg, conn) == {bag: ("a", "b c", "d")}  # a configured key is no bag
        Capture(cfg, once=True).run()
        pg.execute(
            "INSERT INTO public.keyed VALUES (1, 'x');"
            "INSERT INTO public.\"bag table\" VALUES (1, 'y', 2.5);"
            "INSERT INTO public.given VALUES (1, 'z')"
        )
        Capture(cfg, once=True).run()
        assert known_bags(cfg) == known_bags(cfg, conn) == {bag: ("a", "b c", "d")}  # the log's own, the same
        pg.execute('ALTER TABLE public."bag table" ADD PRIMARY KEY (a)')
        assert known_bags(cfg, conn) == {bag: ("a", "b c", "d")}  # the log's word while it knows the table
    finally:
        conn.close()
