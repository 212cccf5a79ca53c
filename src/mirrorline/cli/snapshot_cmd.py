"""Consistent initial load of a target: over the wire (snapshot --target NAME), or through files
(snapshot export DIR, then snapshot load --target NAME DIR). Progress goes to stderr; the target then continues from
the log at the snapshot's consistent point."""

from __future__ import annotations

import argparse
import json

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.errors import UsageError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk-mb", type=float, default=128.0, help="size of a chunk read by one task (default 128)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--target", help="the target to load over the wire")
    p.add_argument(
        "--table",
        action="append",
        metavar="SCHEMA.NAME",
        help="only this configured table (repeatable): a table added to a live target, or one reloaded (it is "
        "created again with the source's current shape, e.g. after a schema change the target stopped at)",
    )
    _common(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    exp = sub.add_parser("export", help="write a consistent snapshot of the source as a folder of chunk files")
    add_config_argument(exp)
    exp.add_argument("dir", help="where to create the uniquely named snapshot folder")
    _common(exp)
    load = sub.add_parser("load", help="check an exported snapshot folder and load it into a target")
    add_config_argument(load)
    load.add_argument("--target", required=True, help="the target to load")
    load.add_argument("dir", help="the exported snapshot folder")
    _common(load)


def run(args: argparse.Namespace) -> int:
    from mirrorline.snapshot import Options, export_snapshot, load_snapshot, snapshot_target

    cfg = load_config(args)
    opts = Options(chunk_mb=args.chunk_mb, progress=not args.quiet)
    if args.action == "export":
        res = export_snapshot(cfg, args.dir, options=opts)
    elif args.action == "load":
        res = load_snapshot(cfg, args.target, args.dir, options=opts)
    else:
        if not args.target:
            raise UsageError(
                "snapshot needs --target NAME (or the export / load actions)",
                hint="mirrorline snapshot --target NAME, snapshot export DIR, snapshot load --target NAME DIR",
            )
        res = snapshot_target(cfg, args.target, tables=args.table, options=opts)
    print(json.dumps(res.to_json()) if args.json else res.summary())
    if res.folder is not None and args.action == "export" and not args.json:
        print(res.folder)
    return 0
