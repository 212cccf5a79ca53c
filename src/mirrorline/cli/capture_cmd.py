"""Capture changes from the source through logical decoding (pgoutput) into the change log."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument(
        "--once", action="store_true", help="stop once everything the source had committed at start is in the log",
    )

def run(args: argparse.Namespace) -> int:
    load_config(args)
    raise not_built("capture", "the capture issue (#3)")
