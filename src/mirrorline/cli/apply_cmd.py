"""Apply the change log to the target(s), compiling units of work as needed: each unit is closed by the latency
threshold or the size limit ([apply] latency, max_changes), compiled once into net row changes on Spark, and applied
with set-based statements, the target's position committed in the same transaction. With --once, stop when the
target(s) have applied everything the log held at start."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, print_unit
from mirrorline.cli.main import add_config_argument
from mirrorline.errors import MirrorlineError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--target", help="only this target (default: every target)")
    p.add_argument("--once", action="store_true", help="stop once the target(s) applied everything in the log")


def run(args: argparse.Namespace) -> int:
    import contextlib
    import signal
    import sys
    import threading

    from mirrorline.pipeline import Applier, UnitReport
    from mirrorline.snapshot import needs_load

    config = load_config(args)
    for name in [args.target] if args.target else list(config.targets):
        tcfg = config.targets.get(name)
        if tcfg is not None and tcfg.initial == "files" and needs_load(config, name):
            raise MirrorlineError(
                f'target {name} waits for files (initial = "files"): there is nothing to apply to yet',
                hint=f"mirrorline snapshot export DIR, carry it over, mirrorline snapshot load --target {name} DIR",
                target=name,
            )
    applier = Applier(config, [args.target] if args.target else None)
    try:
        if args.once:
            reports = applier.catch_up(on_unit=print_unit, progress=sys.stderr)
        else:
            applier.start_warm_up()
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            reports = []

            def on_unit(r: UnitReport) -> None:
                reports.append(r)
                print_unit(r)

            with contextlib.suppress(KeyboardInterrupt):
                applier.follow(stop, on_unit=on_unit)
        positions = applier.positions()
    finally:
        applier.close()
    changes = sum(r.changes for r in reports)
    where = ", ".join(f"{n} at {p}" for n, p in positions.items())
    print(f"applied {len(reports)} units ({changes} changes); {where}", file=sys.stderr)
    return 0
