"""Remove what replication made at the source: the replication slot (which otherwise keeps WAL there for as long as
it exists) and the publication, when it belongs to this configuration's log. Refused while a capture streams from
the slot. The change log and the targets are left as they are; a later `run` starts a new slot, and every target
then needs a reload (the changes in between are not captured). Without --yes, says what it would drop and exits 2."""

from __future__ import annotations

import argparse
import sys

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--yes", action="store_true", help="drop them (without it: only say what would be dropped)")


def run(args: argparse.Namespace) -> int:
    from mirrorline.capture.source import connect, inspect_teardown, teardown
    from mirrorline.errors import ConfigError, UsageError

    config = load_config(args)
    src = config.source
    if src is None:
        raise ConfigError(str(config.file), "source", "no [source] is configured: nothing to tear down")
    owner = str(config.log.path)
    conn = connect(src.dsn)
    try:
        conn.autocommit = True
        if not args.yes:
            plan = inspect_teardown(conn, src.slot, src.publication).plan(owner)
            if not plan:
                print(f"nothing to tear down: no slot {src.slot} and no publication {src.publication} of this log")
                return 0
            raise UsageError(
                "teardown would " + "; ".join(plan),
                hint="run it again with --yes to do so",
            )
        done = teardown(conn, src.slot, src.publication, owner)
    finally:
        conn.close()
    for line in done.done or ["nothing to tear down"]:
        print(line, file=sys.stdout)
    return 0
