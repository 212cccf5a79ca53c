"""Entry point: ``mirrorline COMMAND -c CONFIG``.

Exit status: 0 success, 1 when ``verify`` finds a difference or ``status`` finds replication unhealthy, 2 usage or
configuration error, 3 any other failure, each with a one-line reason on stderr; 4 an internal error (a bug), with
its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from mirrorline import __version__
from mirrorline.errors import MirrorlineError
from mirrorline.osthreads import name_threads

# (command, module, one-line help). Order is the order of `mirrorline --help`.
COMMANDS: list[tuple[str, str, str]] = [
    ("run", "mirrorline.cli.run_cmd", "capture, compile and apply for every target"),
    ("capture", "mirrorline.cli.capture_cmd", "source to change log only"),
    ("compile", "mirrorline.cli.compile_cmd", "compile the change log into net row changes (units of work) only"),
    ("apply", "mirrorline.cli.apply_cmd", "change log to target(s) only, compiling as needed"),
    ("snapshot", "mirrorline.cli.snapshot_cmd", "consistent initial load of a target, over the wire or through files"),
    ("log", "mirrorline.cli.log_cmd", "import or export the change log as deltaflood/daystream lines"),
    ("status", "mirrorline.cli.status_cmd", "targets, positions, lag and the slot's retained WAL"),
    ("verify", "mirrorline.cli.verify_cmd", "compare source and target tables (exit 1 on any difference)"),
    ("maintain", "mirrorline.cli.maintain_cmd", "compact and clean up the files of Delta and Iceberg targets"),
    ("target", "mirrorline.cli.target_cmd", "list or drop the targets the change log keeps changes for"),
    ("reload", "mirrorline.cli.reload_cmd", "ask a live run to read its configuration again (SIGHUP)"),
    (
        "teardown",
        "mirrorline.cli.teardown_cmd",
        "drop the replication slot and publication this log made at the source",
    ),
    (
        "demo",
        "mirrorline.cli.demo_cmd",
        "the embedded default: a throwaway PostgreSQL replicated into SQLite, DuckDB, Delta",
    ),
]


CONFIG_HELP = "configuration file (TOML; default: $MIRRORLINE_CONFIG or ./mirrorline.toml)"


def add_config_argument(p: argparse.ArgumentParser) -> None:
    """A command's ``-c/--config``; given before the command, it counts the same (:func:`main` fills the default)."""
    p.add_argument("-c", "--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
    p.set_defaults(_takes_config=True)


def default_config() -> str:
    return os.environ.get("MIRRORLINE_CONFIG", "mirrorline.toml")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mirrorline",
        description="Change-data-capture replication of PostgreSQL tables: capture once through pgoutput, stage in "
        "a durable change log, compile net row changes with Spark, apply set-based to PostgreSQL, SQLite, "
        "DuckDB, Delta Lake and Apache Iceberg targets, exactly once.",
        epilog="Exit status: 0 success, 1 verify found a difference or status found replication unhealthy, 2 usage or "
        "configuration error, 3 other failure, 4 an internal error (a bug; its traceback is printed).",
    )
    parser.add_argument("--version", action="version", version=f"mirrorline {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("-c", "--config", default=argparse.SUPPRESS, help=CONFIG_HELP + "; before or after COMMAND")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip())
        # SUPPRESS: an absent sub-level -v must not reset the count given before the command
        p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


INTERNAL_ERROR = 4  # (see the module's docstring)


def main(argv: Sequence[str] | None = None) -> int:

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help exits 0, usage errors exit 2
        return int(e.code or 0)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "_takes_config", False) and not hasattr(args, "config"):
        args.config = default_config()
    level = logging.WARNING - 10 * min(args.verbose, 2)
    # -vv: mirrorline's debug lines; the libraries' (py4j logs every call to the JVM) stay at info
    logging.basicConfig(
        level=max(level, logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("mirrorline").setLevel(level)
    if args.verbose < 2:  # py4j logs to the root logger what it raises anyway (Ctrl-C inside a call to the JVM)
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda r: f"{os.sep}py4j{os.sep}" not in r.pathname)
    if threading.current_thread() is threading.main_thread():  # (a command may set its own: run does)
        _interrupted.clear()
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        return int(args._module.run(args) or 0)
    except MirrorlineError as e:
        print(f"mirrorline {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        mute_jvm()
        print(f"mirrorline {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # the machine refused a file operation (a full disk, a permission): said, not a traceback
        logging.getLogger("mirrorline").debug("%s failed", args.command, exc_info=True)
        print(f"mirrorline {args.command}: {os_error_text(e)}", file=sys.stderr)
        return 3
    except Exception as e:  # a bug: its traceback, and an exit code no command gives for anything else
        if _interrupted.is_set():  # Ctrl-C in a library's form (DuckDB: "Query interrupted"): the interrupt it is
            logging.getLogger("mirrorline").debug("interrupted; the library said: %s", e, exc_info=True)
            mute_jvm()
            print(f"mirrorline {args.command}: interrupted", file=sys.stderr)
            return 130
        import traceback

        traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(
            f"mirrorline {args.command}: internal error: {type(e).__name__}: {first} (a bug: report it with the "
            "lines above; positions are where they were, so a restart continues correctly)",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


_interrupted = threading.Event()


def _on_sigint(*_: object) -> None:
    """Ctrl-C: KeyboardInterrupt, as Python's own handler, remembered (a library may turn it into its own error)."""
    _interrupted.set()
    raise KeyboardInterrupt


def mute_jvm() -> None:
    """Ctrl-C: what Spark's JVM says about the calls it cut short is not printed (when this process started one)."""
    sparkenv = sys.modules.get("mirrorline.sparkenv")
    if sparkenv is not None:
        sparkenv.mute_jvm()


def os_error_text(e: OSError) -> str:
    """What a refused file operation means for mirrorline, and what to do."""
    import errno

    what = e.strerror or str(e)
    where = f" ({e.filename})" if e.filename else ""
    code = e.errno
    if code is None:  # (pyarrow's OSError carries the errno in its text only)
        for c in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            if f"errno {c}]" in str(e) or f"Errno {c}]" in str(e):
                code = c
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return (
            f"{what}{where}: the disk, a quota or a file size limit is full (free space, or move the [log] path or "
            "the target, then run again: what was not written was not confirmed to the source or recorded as "
            "applied, so nothing is lost)"
        )
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{what}{where}: mirrorline may not write there (check the folder's owner and mode, then run again)"
    return f"{what}{where} (run again with -vv for details)"


# how long jemalloc keeps the pages of Arrow's freed buffers before it gives them back to the system (arrow_allocator)
ARROW_JEMALLOC_CONF = "dirty_decay_ms:100,muzzy_decay_ms:100"


def arrow_allocator() -> None:
    """Arrow's buffers from jemalloc unless the user's environment names an allocator (``ARROW_DEFAULT_MEMORY_POOL``;
    Spark's Python workers inherit it): it gives freed memory back where pyarrow's default, mimalloc, kept it
    (``./dev bench bigtxn --tables narrow --shapes update``, one run each: ``run``'s Python peak 818 MB with mimalloc,
    673 MB with jemalloc, every target as soon or sooner). Set before pyarrow is imported, which reads it once.

    jemalloc gives back the pages of what was freed after 100 ms rather than Arrow's 1 s (``JE_ARROW_MALLOC_CONF``,
    read by Arrow's jemalloc as it starts, unless the user's environment sets it): ``./dev bench bigtxn --tables
    wide --shapes insert``, three runs paired with three at 1 s: run's tree at its peak 1,430-1,464 MB against
    1,473-1,531 (its Python process 815-854 MB against 850-915), its Python's CPU 39.9-41.5 s against 37.5-44.4;
    0 ms gave back a further 50 MB but cost 40% more CPU."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", ARROW_JEMALLOC_CONF)


# how long a thread holds the GIL before one waiting takes it, in seconds (Python's default: 5 ms). run's threads
# mostly call into libraries that let go of the GIL while they work and take it back often (DuckDB after each of its
# tasks, SQLite, psycopg, Arrow): each take waits out the interval of a thread that runs Python meanwhile (capture's
# decoding, the compile). A DuckDB insert of 400,000 rows of 2 kB beside two threads running Python: 19-21 s at 5
# ms, 8.0 s at 1 ms, 7.1 s beside threads that do not hold the GIL. bench/live --phases r1000,unthrottled, two runs
# each: at 1,000 tps p99 1.08-1.60 s against 1.11-2.43 s, CPU per target alike (1.36-1.40x against 1.39-1.46x the
# subscriber's); unthrottled p99 7.0-8.2 s against 10.8-12.3 s. bench/bigtxn's six shapes do not tell them apart
SWITCH_INTERVAL = 0.001


def entry() -> None:
    """The ``mirrorline`` command. What it writes (the log, exports, file targets, scratch) is its user's alone,
    whatever the umask: they hold the source's rows (PostgreSQL keeps its data folder 0700 likewise)."""
    os.umask(0o077)
    arrow_allocator()
    name_threads()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        code = main()
    except KeyboardInterrupt:  # a Ctrl-C as the command returned: interrupted, as one a moment earlier would have been
        code = 130
    # the command is done: a Ctrl-C while the interpreter and Spark's JVM shut down changes nothing (it would end the
    # process by the signal, exit status -2, after the command's own report)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _finish(code)


def _finish(code: int) -> NoReturn:
    """End the process as the interpreter's exit would (its other threads joined, the exit handlers run: Spark
    stopped, scratch removed, streams flushed) but without tearing the interpreter down: a native thread of a
    target's library (DuckDB, delta-rs, Arrow) that outlives the command can take the GIL while the interpreter is
    torn down, which aborts the process (SIGABRT, "PyGILState_Release ... finalizing") after the command succeeded."""
    import atexit

    threading._shutdown()  # type: ignore[attr-defined]  # what the exit does first: executors shut, threads joined
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
