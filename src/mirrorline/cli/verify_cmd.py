"""Compare source and target tables at the same position: row counts and order-independent checksums. Exit status
1 when any table differs (they are listed). With --diff, a table that differs is narrowed down to its rows: checksums
of buckets of keys on both sides, then the rows of the differing buckets matched by key; the first N are printed
(missing at the target, extra at the target, or changed with the differing columns' values on both sides)."""

from __future__ import annotations

import argparse
import json
import sys

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--target", action="append", help="only this target (repeatable; default: every target)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")
    p.add_argument(
        "--diff",
        type=int,
        nargs="?",
        const=10,
        default=0,
        metavar="N",
        help="for a table that differs, print the first N differing rows (default 10) and how many differ",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for capture to reach the verification point (default 120)",
    )


def run(args: argparse.Namespace) -> int:
    from mirrorline.verify import verify

    report = verify(load_config(args), args.target, wait_seconds=args.wait, diff=max(args.diff, 0))
    print(json.dumps(report.to_json(), indent=1) if args.json else report.text())
    if not report.ok:
        bad = [f"{t.target}: {', '.join(t.differing) or t.error}" for t in report.targets if not t.ok]
        print("mirrorline verify: differences in " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0
