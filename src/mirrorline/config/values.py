"""How the configuration file's values are read: durations, sizes and the ``threads`` setting from their text forms,
and :class:`Reader`, which reads one TOML table with errors that name the file and the key and a check for unknown
keys. Shared by every section's parsing (:mod:`mirrorline.config`, :mod:`mirrorline.config.targets`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from mirrorline.errors import ConfigError

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: Any) -> float:
    """``"2s"``, ``"500ms"``, ``"1m"``, ``"1h"``, ``"7d"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            n = float(m.group(1))
            return n * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}[m.group(2) or "s"]
    raise ValueError(f'expected a duration such as "2s", "500ms" or "1m", got {value!r}')


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB)?\s*$", re.IGNORECASE)


def parse_size(value: Any) -> int:
    """``"50GB"``, ``"500MB"`` (powers of 1024) or a number of bytes -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "B").upper()
            return int(float(m.group(1)) * {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}[unit])
    raise ValueError(f'expected a size such as "500MB" or "50GB", got {value!r}')


def parse_threads(value: Any) -> tuple[int, float | None, int | None]:
    """``threads`` as a number, or the IBM form ``"threads:latency:builders"`` (e.g. ``"2:45:3"``, latency in
    seconds). Returns (threads, latency or None, builders or None)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError("threads must be at least 1")
        return value, None, None
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(":")]
        if 1 <= len(parts) <= 3 and all((p.isascii() and p.isdigit()) or not p for p in parts) and any(parts):
            # an empty field is that field's default, as IBM writes it: "1::1", "::2"
            nums = [int(p) if p else None for p in parts] + [None] * (3 - len(parts))
            threads, latency, builders = nums
            if (threads is not None and threads < 1) or (builders is not None and builders < 1):
                raise ValueError("threads and builders must be at least 1")
            return threads or 1, float(latency) if latency is not None else None, builders
    raise ValueError(f'expected a number of threads or "threads:latency:builders" such as "2:45:3", got {value!r}')


class Reader:
    """Reads one TOML table with file/key-qualified errors and a check for unknown keys."""

    def __init__(self, file: str, prefix: str, data: Any) -> None:
        self.file, self.prefix = file, prefix
        if not isinstance(data, dict):
            raise ConfigError(file, prefix or None, f"expected a table, got {type(data).__name__}")
        self.data = data

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, reason: str) -> ConfigError:
        return ConfigError(self.file, self.key(name), reason)

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        if name not in self.data:
            if required:
                raise self.fail(name, "is required")
            return default
        value = self.data[name]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(name, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(name, f"expected {_kind_name(kind)}, got {type(value).__name__} {value!r}")
        return value

    def expand(self, name: str, text: str) -> str:
        """``text`` with each ``${NAME}`` replaced by that environment variable's value, read now (a secret kept out
        of the file: a password in a DSN, a catalog's token); a variable not set is an error naming it, never a
        value."""

        def env(m: re.Match[str]) -> str:
            got = os.environ.get(m.group(1))
            if got is None:
                raise self.fail(name, f"the environment variable {m.group(1)} is not set")
            return got

        return _ENV_RE.sub(env, text)

    def duration(self, name: str, default: Any) -> float:
        """A duration setting in seconds (``parse_duration``), or an error naming the key."""
        try:
            return parse_duration(self.get(name, (str, int, float), default))
        except ValueError as e:
            raise self.fail(name, str(e)) from None

    def only(self, *allowed: str) -> None:
        for k in self.data:
            if k not in allowed:
                raise self.fail(k, f"unknown key (allowed here: {', '.join(allowed)})")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a table", bool: "a boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)
