"""Show each target's state (new, loading, catching up, live), applied position and lag, the change log, and the slot's
retained WAL; warn when one slow target makes the log or the slot grow. Exit status 1 when replication is unhealthy:
the source or the log cannot be reached, a target cannot be read or was stopped by an error (until it applies a unit
again), or (--max-lag) a target is further behind than the threshold. --check prints one line for cron, Nagios-style
checks and Kubernetes probes, with their exit codes: 0 OK; 1 WARNING (a target further behind than --warn-lag, or a
warning status gives: a slow target making the log or the slot grow, a table gone from the source); 2 CRITICAL
(unhealthy, as above); 3 UNKNOWN (the configuration cannot be read)."""

from __future__ import annotations

import argparse
import json
import sys

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument
from mirrorline.config.values import parse_duration
from mirrorline.errors import ConfigError, MirrorlineError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON document instead of text")
    fmt.add_argument("--prometheus", action="store_true", help="Prometheus text exposition format")
    fmt.add_argument(
        "--check",
        action="store_true",
        help="one line, Nagios-style: OK (exit 0), WARNING (1), CRITICAL (2) or UNKNOWN (3), and why",
    )
    p.add_argument("--prometheus-file", metavar="FILE", help="also write the Prometheus text to FILE (atomically)")
    p.add_argument(
        "--max-lag",
        metavar="DURATION",
        help='unhealthy (exit 1; --check: CRITICAL) when a target is further behind than this, e.g. "30s"',
    )
    p.add_argument(
        "--warn-lag",
        metavar="DURATION",
        help='--check: WARNING when a target is further behind than this (and not beyond --max-lag), e.g. "10s"',
    )


OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3  # --check's exit codes, as Nagios-style checks read them


def _duration(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as e:
        raise ConfigError(option, None, str(e)) from None


def run(args: argparse.Namespace) -> int:
    from mirrorline.status import render_prometheus, status, write_prometheus

    max_lag = _duration("--max-lag", args.max_lag)
    warn_lag = _duration("--warn-lag", args.warn_lag)
    if args.check:
        try:
            st = status(load_config(args))
        except MirrorlineError as e:
            print(f"UNKNOWN: {e}")
            return UNKNOWN
    else:
        st = status(load_config(args))
    problems = st.problems(max_lag)
    if args.prometheus_file:
        write_prometheus(st, args.prometheus_file)
    if args.check:
        lags = ", ".join(f"{t.name} {t.lag_seconds or 0:.1f} s" for t in st.targets)
        if problems:
            print(f"CRITICAL: {'; '.join(problems)}")
            return CRITICAL
        behind = [
            f"target {t.name} is {t.lag_seconds:.1f} s behind (more than {warn_lag:g} s)"
            for t in st.targets
            if warn_lag is not None and t.lag_seconds is not None and t.lag_seconds > warn_lag
        ]
        if behind or st.warnings:
            print(f"WARNING: {'; '.join(behind + st.warnings)}")
            return WARNING
        print(f"OK: lag {lags or 'no targets'}")
        return OK
    if args.json:
        print(json.dumps({**st.to_json(), "healthy": not problems, "problems": problems}, indent=1))
    elif args.prometheus:
        sys.stdout.write(render_prometheus(st))
    else:
        print(st.text())
    return 1 if problems else 0
