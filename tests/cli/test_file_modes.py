"""What ``mirrorline`` writes is its user's alone: under a umask of 022, the log's folders and segments,
an export's folder and chunks and a SQLite target are 0700 and 0600, as PostgreSQL keeps its data folder: they hold
the source's rows."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import configs
import pytest


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mirrorline.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(0o022),
    )


def _modes(root: Path) -> dict[str, int]:
    out = {str(root): stat.S_IMODE(root.stat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in [*dirnames, *filenames]:
            p = Path(dirpath) / n
            out[str(p)] = stat.S_IMODE(p.lstat().st_mode)
    return out


@pytest.mark.pg
@pytest.mark.spark
def test_files_are_the_users_alone(pg: Any, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE public.items (id integer PRIMARY KEY, v text); INSERT INTO public.items VALUES (1, 'a')")
    cfg = configs.write(
        tmp_path / "m.toml",
        source=pg.dsn,
        log="log",
        tables=["public.items"],
        targets={"lite": f"sqlite:///{tmp_path / 'lite.db'}"},
    )
    (tmp_path / "exports").mkdir(mode=0o755)
    for args in (
        ("capture", "--once"),
        ("snapshot", "--target", "lite"),
        ("snapshot", "export", str(tmp_path / "exports")),
    ):
        pg.execute("UPDATE public.items SET v = v || '+'")
        r = _cli(*args, "-c", str(cfg))
        assert r.returncode == 0, r.stderr
    written = {**_modes(tmp_path / "log"), **_modes(tmp_path / "exports"), str(tmp_path / "lite.db"): 0}
    written.pop(str(tmp_path / "exports"))  # (the user's own folder, made before)
    written[str(tmp_path / "lite.db")] = stat.S_IMODE((tmp_path / "lite.db").stat().st_mode)
    assert len(written) > 5
    loose = {p: oct(m) for p, m in written.items() if m & 0o077}
    assert not loose, loose


@pytest.mark.pg
def test_a_full_disk_is_said_and_loses_nothing(pg: Any, tmp_path: Path) -> None:
    """A write the machine refuses (a file size limit here, as a full disk would: EFBIG, ENOSPC) while capture
    writes a segment: one line saying what is full and what to do, exit 3, no partial segment, nothing confirmed;
    run again with room, capture takes every change."""
    import resource
    import signal

    from mirrorline.log.reader import ChangeLog

    pg.execute("CREATE TABLE public.items (id integer PRIMARY KEY, v text)")
    cfg = configs.write(tmp_path / "m.toml", source=pg.dsn, log="log", tables=["public.items"])
    assert _cli("capture", "--once", "-c", str(cfg)).returncode == 0
    pg.execute(
        "INSERT INTO public.items SELECT g, (SELECT string_agg(md5(random()::text || g || i), '') "
        "FROM generate_series(1, 20) i) FROM generate_series(1, 5000) g"
    )

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    r = subprocess.run(
        [sys.executable, "-m", "mirrorline.cli.main", "capture", "--once", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited,
    )
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "is full" in r.stderr and "nothing is lost" in r.stderr, r.stderr
    assert ChangeLog(tmp_path / "log").durable() is None
    assert not [p for p in (tmp_path / "log").rglob("*") if p.is_file() and ".tmp" in p.name]
    r = _cli("capture", "--once", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert ChangeLog(tmp_path / "log").count(None, ChangeLog(tmp_path / "log").durable()) == 5000
