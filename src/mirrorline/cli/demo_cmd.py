"""The embedded default: start a throwaway PostgreSQL with a generated workload, replicate it live into a SQLite file,
a DuckDB file and a folder of Delta Lake tables (capture, initial snapshot, compile on Spark, bulk apply), then show
status and verify. Exit status 1 if verify finds a difference."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transactions", type=int, default=2000, help="random transactions to run (default 2000)")
    p.add_argument(
        "--large", type=int, default=100_000, help="rows of the one large (streamed) transaction (default 100000)"
    )
    p.add_argument("--keep", metavar="DIR", help="keep the demo's files (config, log, targets) in DIR")
    p.add_argument(
        "--serve",
        nargs="?",
        const="127.0.0.1:0",
        metavar="HOST:PORT",
        help="serve run's status page (and metrics) and keep the source changing until Ctrl-C; prints the page's "
        "address (default: a free port of 127.0.0.1)",
    )


def run(args: argparse.Namespace) -> int:
    from mirrorline.demo import run_demo

    return run_demo(transactions=args.transactions, large=args.large, keep=args.keep, serve=args.serve)
