"""Show each target's state (new, loading, catching up, live), applied position and lag, the change log, and the
slot's retained WAL; warn when one slow target makes the log or the slot grow."""

from __future__ import annotations

import argparse
import json
import sys

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON document instead of text")
    fmt.add_argument("--prometheus", action="store_true", help="Prometheus text exposition format")
    p.add_argument("--prometheus-file", metavar="FILE", help="also write the Prometheus text to FILE (atomically)")


def run(args: argparse.Namespace) -> int:
    from mirrorline.status import render_prometheus, status, write_prometheus

    st = status(load_config(args))
    if args.prometheus_file:
        write_prometheus(st, args.prometheus_file)
    if args.json:
        print(json.dumps(st.to_json(), indent=1))
    elif args.prometheus:
        sys.stdout.write(render_prometheus(st))
    else:
        print(st.text())
    return 0
