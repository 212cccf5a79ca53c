"""Capture, compile and apply for every configured target, continuously: capture streams the source into the change
log while units of work are compiled on Spark and applied to each target. A target that needs loading (new, or a
table added to the configuration) is loaded beside the others, which keep applying, and joins them once loaded. A
target or a table that fails stops alone and is tried again. SIGHUP reads the configuration again: targets added are
loaded, targets removed are no longer applied (other changes take effect at the next start). SIGTERM stops. With
--once, load first, then stop when every target has applied everything the source had committed when the command
started."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mirrorline.cli._common import Interrupt, load_config, print_unit
from mirrorline.cli.main import add_config_argument, mute_jvm

if TYPE_CHECKING:
    from mirrorline.pipeline import Runner


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

    runner: Runner | None = None
    interrupted: list[bool] = []
    stop_now = Interrupt()

    def on_sigint(*_: object) -> None:
        """Ctrl-C stops as SIGTERM does once units are applied (the one being applied ends first); before that (the
        start and the first loads), and at a second Ctrl-C, at once."""
        if stop_now.done.is_set():  # (stopping already)
            return
        first = not interrupted
        interrupted.append(True)
        if runner is None:
            stop_now.raise_now()
        runner.stop()
        if not first or not runner.applying:
            mute_jvm()
            stop_now.raise_now()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        config = load_config(args)
        from mirrorline.pipeline import Runner

        runner = live = Runner(
            config,
            once=args.once,
            on_unit=print_unit,
            on_message=lambda m: print(m, file=sys.stderr),
            forget_removed=args.forget_removed,
        )
    except (KeyboardInterrupt, Exception) as e:  # still starting: nothing was captured or applied, nothing moved
        if not isinstance(e, KeyboardInterrupt) and not _was_interrupt(stop_now, e):
            raise
        stop_now.taken()
        print(
            "mirrorline run: interrupted; kept: captured 0 changes; applied 0 units (0 changes); interrupted while "
            "starting: the log and every target are as they were",
            file=sys.stderr,
        )
        return 130
    try:
        signal.signal(signal.SIGTERM, lambda *_: live.stop())
        signal.signal(signal.SIGHUP, lambda *_: live.request_reload())  # targets added or removed: taken up live
        result = live.run()
    except (KeyboardInterrupt, Exception) as e:
        if not isinstance(e, KeyboardInterrupt) and not _was_interrupt(stop_now, e):
            raise
        stop_now.taken()
        mute_jvm()
        interrupted.append(True)
        live.stop()
        result = live.result
    stop_now.taken()
    where = [f"{n} at {p}" for n, p in result.positions.items()]
    where += [
        f"{n} not read (a load it had not finished starts again at the next start)"
        for n in config.targets
        if n not in result.positions
    ]
    done = f"captured {result.captured} changes; applied {result.units} units ({result.applied} changes)"
    if interrupted:  # (one line: the log keeps what it captured, each target its position; a restart goes on)
        print(f"mirrorline run: interrupted; kept: {done}; {', '.join(where)}", file=sys.stderr)
        return 130
    print(f"{done}; {', '.join(where)}", file=sys.stderr)
    return 0


def _was_interrupt(stop_now: Interrupt, e: Exception) -> bool:
    """An error met after a stop at once was asked for is that stop in a library's form (DuckDB turns the
    KeyboardInterrupt it sees into ``Query interrupted``): said as the interrupt it is, its traceback at debug level."""
    if not stop_now.raised:
        return False
    import logging

    logging.getLogger("mirrorline").debug("stopped at once; the library said: %s", e, exc_info=True)
    return True
