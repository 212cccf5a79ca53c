"""The tests' one builder of mirrorline configuration files (the TOML ``mirrorline.config`` reads), from keyword
arguments: every string and key quoted as TOML wants it (a table named ``sales."Order Items"`` or ``public.with
space``, a DSN holding quotes), nothing checked (a test of a configuration error writes its wrong value the same way).

``text(...)`` gives the file's text, ``write(path, ...)`` writes it, ``load(path, ...)`` writes it and loads it::

    configs.load(tmp_path / "m.toml", source=pg.dsn, log=tmp_path / "log", apply={"latency": "100ms"},
                 tables=["public.items"], targets={"cache": "sqlite:///cache.db", "dw": {"url": url, "mode": "mirror"}})
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mirrorline import config as C

Settings = Mapping[str, Any]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def text(
    *,
    source: str | Settings | None = None,
    log: str | os.PathLike[str] | Settings | None = None,
    apply: Settings | None = None,
    tables: Iterable[str] | Mapping[str, Settings] = (),
    targets: Mapping[str, str | Settings] | None = None,
    spark: Settings | None = None,
    metrics: Settings | None = None,
) -> str:
    """A configuration file's text. ``source``: its DSN, or the ``[source]`` settings; ``log``: its path, or the
    ``[log]`` settings; ``tables``: the configured names (as the file names them: ``public.items``,
    ``sales."Order Items"``), or each name with its settings; ``targets``: each name with its URL, or with its
    settings (``url`` among them). A section left out (None, or empty) is not written."""
    sections: list[tuple[tuple[str, ...], Settings]] = []
    if source is not None:
        sections.append((("source",), {"dsn": source} if isinstance(source, str) else source))
    if log is not None:
        sections.append((("log",), log if isinstance(log, Mapping) else {"path": log}))
    if apply:
        sections.append((("apply",), apply))
    for name, settings in tables.items() if isinstance(tables, Mapping) else ((t, {}) for t in tables):
        sections.append((("tables", name), settings))
    for name, target in (targets or {}).items():
        sections.append((("targets", name), {"url": target} if isinstance(target, str) else target))
    if spark:
        sections.append((("spark",), spark))
    if metrics:
        sections.append((("metrics",), metrics))
    lines: list[str] = []
    for header, settings in sections:
        lines.append("[" + ".".join(_key(k) for k in header) + "]")
        lines += [f"{_key(k)} = {_value(v)}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


def write(path: Path, **sections: Any) -> Path:
    """Write :func:`text` ``(**sections)`` to ``path``; returns ``path``."""
    path.write_text(text(**sections))
    return path


def load(path: Path, **sections: Any) -> C.Config:
    """Write :func:`text` ``(**sections)`` to ``path`` and load it as mirrorline does."""
    return C.load(write(path, **sections))


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(s: str) -> str:
    out = (_ESCAPES.get(ch) or (f"\\u{ord(ch):04X}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch) for ch in s)
    return '"' + "".join(out) + '"'


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"no TOML number for {v!r} here")
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, os.PathLike):
        return _string(os.fspath(v))
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML value for {type(v).__name__} {v!r}")
