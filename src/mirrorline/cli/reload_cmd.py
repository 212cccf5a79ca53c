"""Ask a live ``mirrorline run`` to read its configuration again (it does on SIGHUP): targets added are loaded
beside the others, targets removed are no longer applied; any other change is said to take effect at its next start.
The file is checked first: an invalid one is refused here (exit 2) and nothing is sent, so the running configuration
stays in force. The ``run`` is the process that writes this configuration's change log."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from mirrorline.cli._common import load_config
from mirrorline.cli.main import COMMANDS, add_config_argument
from mirrorline.errors import MirrorlineError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)


def command_of(pid: int) -> tuple[str | None, str | None]:
    """The mirrorline command process ``pid`` runs and the configuration file it was given (None when unknown)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None, None
    names = {c for c, _, _ in COMMANDS}
    command = next((a for a in argv if a in names), None)
    config = None
    for i, a in enumerate(argv):
        if a in ("-c", "--config") and i + 1 < len(argv):
            config = argv[i + 1]
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
    return command, config


def run(args: argparse.Namespace) -> int:
    from mirrorline.log.writer import writer_pid

    config = load_config(args)  # (an invalid file stops here: exit 2, nothing sent)
    pid = writer_pid(config.log.path)
    if pid is None:
        raise MirrorlineError(
            f"no mirrorline run writes the change log at {config.log.path}: nothing to reload",
            hint="run reads its configuration when it starts",
        )
    command, theirs = command_of(pid)
    if command != "run":
        raise MirrorlineError(
            f"the change log at {config.log.path} is written by `mirrorline {command or '?'}` (pid {pid}), which "
            "does not read its configuration again",
            hint="restart it to take the change up",
        )
    os.kill(pid, signal.SIGHUP)
    print(f"asked mirrorline run (pid {pid}) to read its configuration again (it says what changed in its output)")
    if theirs is not None and Path(theirs).resolve() != Path(config.file).resolve():
        print(f"note: that run was started with {theirs}; it reads that file, not {config.file}")
    return 0
