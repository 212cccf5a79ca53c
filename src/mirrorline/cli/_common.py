"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse

from mirrorline.config import Config
from mirrorline.errors import NotBuiltError


def load_config(args: argparse.Namespace) -> Config:
    from mirrorline import config

    return config.load(args.config)


def not_built(command: str, issue: str) -> NotBuiltError:
    return NotBuiltError(f"'{command}' is not built yet", hint=f"it arrives with {issue}")
