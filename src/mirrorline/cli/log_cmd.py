"""Interchange with deltaflood/daystream tab-separated lines: import files into the change log, or export the log."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="log_action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="append daystream files to the change log")
    add_config_argument(imp)
    imp.add_argument("--format", choices=["daystream"], default="daystream", help="the line format (daystream)")
    imp.add_argument("files", nargs="+", metavar="FILE", help="daystream files, in order")
    exp = sub.add_parser("export", help="write the change log as daystream lines to stdout")
    add_config_argument(exp)
    exp.add_argument("--format", choices=["daystream"], default="daystream", help="the line format (daystream)")
    exp.add_argument("--from", dest="start", metavar="POS|TIME",
                     help="start after this position (16/B374D848:3) or at this time (ISO 8601)")


def run(args: argparse.Namespace) -> int:
    raise not_built(f"log {args.log_action}", "the capture issue (#3)")
