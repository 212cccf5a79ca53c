"""Interchange with deltaflood/daystream tab-separated lines: import files into the change log, or export the log."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.errors import UsageError
from mirrorline.position import Position


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="log_action", metavar="ACTION", required=True)
    imp = sub.add_parser(
        "import",
        help="append daystream files to the change log (all of them or nothing); lines whose (_c, _s) address was "
        "imported before are skipped",
    )
    add_config_argument(imp)
    imp.add_argument("--format", choices=["daystream"], default="daystream", help="the line format (daystream)")
    imp.add_argument("files", nargs="+", metavar="FILE", help="daystream files, in order")
    exp = sub.add_parser("export", help="write the change log as daystream lines to stdout")
    add_config_argument(exp)
    exp.add_argument("--format", choices=["daystream"], default="daystream", help="the line format (daystream)")
    exp.add_argument(
        "--from",
        dest="start",
        metavar="POS|TIME|C:S",
        help="start after this position (16/B374D848:3), at this time (ISO 8601, or seconds since the epoch as in "
        "daystream's _c), or right after the line whose address is _c C and _s S (1507507200:17): every line keeps "
        "the same (_c, _s) in every export",
    )


def parse_start(text: str) -> tuple[Position | None, int | None, tuple[int, int] | None]:
    """``--from``: a position (exclusive), a time (the first change committed at or after it, in microseconds), or a
    daystream address (exclusive)."""
    text = text.strip()
    if "/" in text:
        try:
            return Position.parse(text), None, None
        except ValueError as e:
            raise UsageError(f"--from: {e}") from None
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if m:
        return None, None, (int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"(\d+)(?:\.(\d{1,6}))?", text)
    if m:
        return None, int(m.group(1)) * 1_000_000 + int((m.group(2) or "0").ljust(6, "0")), None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--from: {text!r} is neither a position (16/B374D848:3), a time (ISO 8601 such as "
            "2017-10-09T00:00:00Z, or seconds since the epoch) nor a daystream address (1507507200:17)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return None, (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds, None


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    cfg = load_config(args)
    if args.log_action == "import":
        from mirrorline.log.interchange import import_daystream

        r = import_daystream(
            cfg.log.path, [Path(f) for f in args.files], cfg.tables, segment_changes=cfg.log.segment_changes
        )
        where = f", positions {r.first} .. {r.last}" if r.first is not None else ""
        skipped = f"; {r.skipped} line(s) imported before were skipped" if r.skipped else ""
        print(
            f"imported {r.changes} changes in {r.transactions} transactions from {r.files} file(s){where}{skipped}",
            file=sys.stderr,
        )
        return 0
    from mirrorline.log.interchange import export_daystream
    from mirrorline.log.reader import ChangeLog

    after, from_ts, address = parse_start(args.start) if args.start else (None, None, None)
    log = ChangeLog(cfg.log.path)
    log.layout.require()
    try:
        export_daystream(log, sys.stdout, after=after, from_ts=from_ts, from_address=address)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        return 0
    return 0
