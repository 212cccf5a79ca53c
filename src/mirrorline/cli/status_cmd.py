"""Show each target's state (new, loading, catching up, live), applied position and lag, the change log, and the slot's
retained WAL; warn when one slow target makes the log or the slot grow. Exit status 1 when replication is unhealthy:
the source or the log cannot be reached, a target cannot be read or was stopped by an error (until it applies a unit
again), or (--max-lag) a target is further behind than the threshold. --check prints one line (OK or CRITICAL and
why) for cron, Nagios-style checks and Kubernetes probes."""

from __future__ import annotations

import argparse
import json
import sys

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.config.values import parse_duration
from mirrorline.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON document instead of text")
    fmt.add_argument("--prometheus", action="store_true", help="Prometheus text exposition format")
    fmt.add_argument("--check", action="store_true", help="one line: OK, or CRITICAL and what is wrong (exit 1)")
    p.add_argument("--prometheus-file", metavar="FILE", help="also write the Prometheus text to FILE (atomically)")
    p.add_argument(
        "--max-lag",
        metavar="DURATION",
        help='unhealthy (exit 1) when a target is further behind than this, e.g. "30s"',
    )


def run(args: argparse.Namespace) -> int:
    from mirrorline.status import render_prometheus, status, write_prometheus

    max_lag = None
    if args.max_lag is not None:
        try:
            max_lag = parse_duration(args.max_lag)
        except ValueError as e:
            raise ConfigError("--max-lag", None, str(e)) from None
    st = status(load_config(args))
    problems = st.problems(max_lag)
    if args.prometheus_file:
        write_prometheus(st, args.prometheus_file)
    if args.check:
        lags = ", ".join(f"{t.name} {t.lag_seconds or 0:.1f} s" for t in st.targets)
        print(f"CRITICAL: {'; '.join(problems)}" if problems else f"OK: lag {lags or 'no targets'}")
    elif args.json:
        print(json.dumps({**st.to_json(), "healthy": not problems, "problems": problems}, indent=1))
    elif args.prometheus:
        sys.stdout.write(render_prometheus(st))
    else:
        print(st.text())
    return 1 if problems else 0
