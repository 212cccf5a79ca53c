"""Remove what replication made: at the source, the replication slot (which otherwise keeps WAL there for as long as
it exists) and the publication, when it belongs to this configuration's log; with --log, the change log too.
Refused while a capture streams from the slot (or, with --log, while a process writes the log). The targets are left
as they are; a later `run` starts a new slot, and every target then needs a reload (the changes in between are not
captured). --dry-run lists what it would remove; without --yes or --dry-run it says the same and exits 2."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.errors import ConfigError, MirrorlineError, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--yes", action="store_true", help="remove them (without it: only say what would be removed)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing (exit 0)")
    p.add_argument("--log", action="store_true", help="also remove the change log (its folder and everything in it)")


def _log_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def run(args: argparse.Namespace) -> int:
    from mirrorline.capture.provision import inspect_teardown, teardown
    from mirrorline.capture.source import connect
    from mirrorline.log.writer import writer_pid

    config = load_config(args)
    src = config.source
    if src is None:
        raise ConfigError(str(config.file), "source", "no [source] is configured: nothing to tear down")
    owner = str(config.log.path)
    root = Path(config.log.path)
    if args.log:
        pid = writer_pid(root)
        if pid is not None:
            raise MirrorlineError(
                f"the change log at {root} is being written by the process with pid {pid}",
                hint="stop `mirrorline run` (or `capture`) first",
            )
    conn = connect(src.dsn)
    try:
        conn.autocommit = True
        if args.dry_run or not args.yes:
            plan = inspect_teardown(conn, src.slot, src.publication).plan(owner)
            if args.log and root.exists():
                plan.append(f"remove the change log at {root} ({_log_size(root)} bytes)")
            if not plan:
                print(f"nothing to tear down: no slot {src.slot} and no publication {src.publication} of this log")
                return 0
            if args.dry_run:
                for line in plan:
                    print(f"would {line}")
                return 0
            raise UsageError(
                "teardown would " + "; ".join(plan),
                hint="run it again with --yes to do so (--dry-run only lists it)",
            )
        done = teardown(conn, src.slot, src.publication, owner)
    finally:
        conn.close()
    lines = done.done
    if args.log and root.exists():
        shutil.rmtree(root)
        lines.append(f"removed the change log at {root}")
    for line in lines or ["nothing to tear down"]:
        print(line, file=sys.stdout)
    return 0
