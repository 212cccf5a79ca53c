"""Capture changes from the source through logical decoding (pgoutput) into the change log."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.position import format_lsn


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument(
        "--once", action="store_true", help="stop once everything the source had committed at start is in the log"
    )


def run(args: argparse.Namespace) -> int:
    import signal
    import sys

    from mirrorline.capture.session import Capture, CaptureStats

    config = load_config(args)
    capture = Capture(config, once=args.once)

    def ready(stats: CaptureStats) -> None:
        if stats.publication is not None:
            print(stats.publication.summary(), file=sys.stderr)
        if stats.slot_created:
            print(f"replication slot {config.source.slot} created", file=sys.stderr)  # type: ignore[union-attr]
        print("capturing" + (f" until {format_lsn(stats.target_lsn)}" if args.once else ""), file=sys.stderr)

    capture.on_ready = ready
    previous = signal.signal(signal.SIGTERM, lambda *_: capture.stop())
    try:
        stats = capture.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    durable = str(stats.durable) if stats.durable is not None else "empty"
    print(
        f"captured {stats.changes} changes in {stats.transactions} transactions ({stats.streamed} streamed, "
        f"{stats.skipped} already in the log); log durable through {durable}, reported flushed "
        f"{format_lsn(stats.durable_lsn)}",
        file=sys.stderr,
    )
    return 0
