"""The embedded default: start a throwaway PostgreSQL, run a generated workload, and show what mirrorline does with
it. Until the apply stage exists, this compiles the workload into net row changes on Spark and prints the figures."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--changes", type=int, default=200_000, help="size of the generated workload (default 200000)")
    p.add_argument("--keep", metavar="DIR", help="keep the demo's files in DIR (default: a temporary folder)")


def run(args: argparse.Namespace) -> int:
    from mirrorline.demo import run_demo

    return run_demo(changes=args.changes, keep=args.keep)
