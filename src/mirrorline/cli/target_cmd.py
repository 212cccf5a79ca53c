"""Manage the targets the change log keeps changes for. ``target drop NAME``: unregister a target removed from the
configuration, so that retention no longer keeps the log for it (its database is left as it is; adding it to the
configuration again loads it whole). ``target list``: every registered reader of the log, configured or not, and the
export folders not loaded yet, with their positions."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from mirrorline import stopped
from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.errors import ConfigError, LogError, MirrorlineError


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="target_action", metavar="ACTION", required=True)
    drop = sub.add_parser("drop", help="unregister a target that is no longer configured from the change log")
    add_config_argument(drop)
    drop.add_argument("name", metavar="NAME", help="the target (or export-<folder>) to unregister")
    ls = sub.add_parser("list", help="the log's registered readers: targets, removed targets, export folders")
    add_config_argument(ls)


def run(args: argparse.Namespace) -> int:
    from mirrorline.log.reader import ChangeLog
    from mirrorline.log.retention import EXPORT_PREFIX, readers, unregister
    from mirrorline.log.writer import live_run

    config = load_config(args)
    log = ChangeLog(config.log.path)
    log.layout.require()
    registered = readers(log)
    if args.target_action == "list":
        for name, r in sorted(registered.items()):
            kind = (
                "target"
                if name in config.targets
                else "export folder"
                if name.startswith(EXPORT_PREFIX)
                else "removed target (holds the log: mirrorline target drop)"
            )
            when = dt.datetime.fromtimestamp(r.updated, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            print(f"{name}\t{r.applied or 'nothing applied'}\t{when}\t{kind}")
        return 0
    name = args.name
    if name in config.targets:
        raise ConfigError(
            str(config.file),
            f"targets.{name}",
            f"target {name} is still configured: run would load it again",
            hint=f"remove [targets.{name}] from the configuration first",
        )
    live = live_run(config.log.path)
    if live is not None and name in live[1]:
        raise MirrorlineError(
            f"target {name} is still applied by the live `mirrorline run` (pid {live[0]})",
            hint="remove it from the configuration that run reads and `mirrorline reload`, then drop it",
            target=name,
        )
    if name not in registered:
        raise LogError(
            f"no target {name} is registered with the change log at {config.log.path}",
            hint="`mirrorline target list` shows the registered ones",
            reader=name,
        )
    unregister(log, name)
    stopped.clear(config.log.path, name)
    print(
        f"target {name} unregistered (it was at {registered[name].applied or 'nothing applied'}); the log no longer "
        "keeps changes for it",
        file=sys.stderr,
    )
    return 0
