"""Capture, compile and apply for every configured target, continuously: capture streams the source into the change
log while units of work are compiled on Spark and applied to each target. A target that needs loading (new, or a
table added to the configuration) is loaded beside the others, which keep applying, and joins them once loaded. A
target or a table that fails stops alone and is tried again. SIGHUP reads the configuration again: targets added are
loaded, targets removed are no longer applied (other changes take effect at the next start). SIGTERM stops. With
--once, load first, then stop when every target has applied everything the source had committed when the command
started."""

from __future__ import annotations

import argparse

from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--once", action="store_true", help="stop once every target has caught up with the source")
    p.add_argument(
        "--forget-removed",
        action="store_true",
        help="unregister from the change log the targets removed from the configuration (else they keep holding "
        "it, with a warning; see `mirrorline target drop`)",
    )


def run(args: argparse.Namespace) -> int:
    import signal
    import sys

    from mirrorline.cli._common import load_config, print_unit
    from mirrorline.pipeline import Runner

    config = load_config(args)
    runner = Runner(
        config,
        once=args.once,
        on_unit=print_unit,
        on_message=lambda m: print(m, file=sys.stderr),
        forget_removed=args.forget_removed,
    )
    signal.signal(signal.SIGTERM, lambda *_: runner.stop())
    signal.signal(signal.SIGHUP, lambda *_: runner.request_reload())  # targets added or removed: taken up live
    try:
        result = runner.run()
    except KeyboardInterrupt:
        runner.stop()
        result = runner.result
    where = ", ".join(f"{n} at {p}" for n, p in result.positions.items())
    print(
        f"captured {result.captured} changes; applied {result.units} units ({result.applied} changes); {where}",
        file=sys.stderr,
    )
    return 0
