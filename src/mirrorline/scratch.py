"""Scratch space that a killed process does not leak.

Everything a process writes as scratch (compiled units' net rows, warm-up files, Spark's shuffle and spill files)
goes under one folder of its own, ``$TMPDIR/mirrorline-scratch/<pid>-<random>/`` (or under ``[spark] scratch``,
storage every executor reaches, on a cluster), which holds an exclusive lock
(``fcntl``) on its ``.owner`` file for as long as the process lives. The kernel drops the lock when the process ends,
however it ends (SIGKILL included), so the first scratch use of any later mirrorline process removes every folder
whose lock it can take: what earlier processes left behind. Folders of live processes are never touched.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from mirrorline.errors import MirrorlineError

_LOCK = ".owner"
_lock = threading.Lock()
_own: tuple[int, Path, int] | None = None  # (pid, folder, fd of the held lock)


_base: Path | None = None  # set by configure(): a folder every Spark executor reaches


def base() -> Path:
    if _base is not None:
        return _base
    return Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / "mirrorline-scratch"


def configure(root: Path | None) -> None:
    """Put this process's scratch under ``root`` (None: the temporary folder) from its first use on: on a Spark
    cluster, files tasks write and the driver reads must be where both reach."""
    global _base
    _base = root


def sweep(root: Path | None = None, keep: Path | None = None) -> list[Path]:
    """Remove the scratch folders of processes that have ended (their lock is free); returns what was removed."""
    root = root or base()
    removed = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    for d in entries:
        if not d.is_dir() or d == keep:
            continue
        try:
            fd = os.open(d / _LOCK, os.O_RDWR)
        except OSError:  # no lock file: being created right now, or its owner died before locking; leave it
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    return removed


def folder() -> Path:
    """This process's scratch folder (made, locked and the leftovers of dead processes swept on first use; a
    forked child gets its own)."""
    global _own
    with _lock:
        if _own is not None and _own[0] == os.getpid():
            return _own[1]
        root = base()
        while True:
            try:
                root.mkdir(parents=True, exist_ok=True, mode=0o700)
                if _base is None:
                    _check_own(root)
                d = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
                fd = os.open(d / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:
                raise MirrorlineError(
                    f"cannot make a scratch folder under {root}: {e.strerror or e}",
                    hint="set TMPDIR to a writable folder with free space",
                    path=str(root),
                ) from None
            fcntl.flock(fd, fcntl.LOCK_EX)
            if (d / _LOCK).exists():
                break
            os.close(fd)  # a sweep took the fresh folder for a dead one between its creation and the lock: again
        _own = (os.getpid(), d, fd)
        atexit.register(_remove_own, os.getpid())
        sweep(root, keep=d)
        return d


def _check_own(root: Path) -> None:
    """The default root, in the shared temporary folder, must be this user's alone: another user who owns it (or may
    write in it) could swap a process's folder for one of theirs and read the rows written there."""
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise MirrorlineError(
            f"the scratch folder {root} is not this user's own (a link, another user's, or writable by others): "
            "mirrorline writes replicated rows there",
            hint=f"remove {root} (mirrorline makes it again, 0700), or set TMPDIR to a folder of your own",
            path=str(root),
        )


def _remove_own(pid: int) -> None:
    if _own is not None and _own[0] == pid == os.getpid():
        shutil.rmtree(_own[1], ignore_errors=True)


def mkdtemp(prefix: str) -> str:
    """A new scratch folder inside this process's (``tempfile.mkdtemp`` with a leak-proof home)."""
    return tempfile.mkdtemp(prefix=prefix, dir=folder())
