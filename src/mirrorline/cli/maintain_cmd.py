"""Compact and clean up the files of Delta and Iceberg targets: each table's small files (one per unit's commit)
rewritten into few (a commit that changes no rows), then the files no version younger than the retention reads
removed. Safe while ``run`` applies: a unit whose commit meets a compaction's is applied again on the new version.
``run`` does the same every ``compact_every`` of each such target."""

from __future__ import annotations

import argparse
import json

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.config.values import parse_duration
from mirrorline.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument(
        "--target", action="append", help="only this target (repeatable; default: every Delta and Iceberg target)"
    )
    p.add_argument(
        "--retention",
        metavar="DURATION",
        help="remove files no version younger than this reads (default: the target's vacuum_retention, 168h)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")


def run(args: argparse.Namespace) -> int:
    import math

    from mirrorline.apply import open_target

    config = load_config(args)
    from mirrorline.apply.kinds import KINDS

    names = args.target or [n for n, t in config.targets.items() if KINDS[t.kind].compacts]
    for n in names:
        if n not in config.targets:
            raise ConfigError(str(config.file), f"targets.{n}", "no such target")
        kind = KINDS[config.targets[n].kind]
        if not kind.compacts:
            raise ConfigError(str(config.file), f"targets.{n}", f"{kind.what} has no files to compact")
    retention: int | None = None
    if args.retention is not None:
        try:
            retention = math.ceil(parse_duration(args.retention) / 3600)
        except ValueError as e:
            raise ConfigError("--retention", None, str(e)) from None
    out = {}
    for n in names:
        tcfg = config.targets[n]
        target = open_target(tcfg)
        try:
            out[n] = target.maintain(retention_hours=retention if retention is not None else tcfg.retention_hours)
        finally:
            target.close()
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for n, tables in out.items():
            for table, done in tables.items():
                print(f"target {n} {table}: " + ", ".join(f"{k} {v}" for k, v in done.items()))
            if not tables:
                print(f"target {n}: no tables yet")
    return 0
