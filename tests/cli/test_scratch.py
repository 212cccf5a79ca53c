"""Scratch space (mirrorline.scratch): a process killed with SIGKILL leaves its scratch folder behind, and the next
process's first use removes it; folders of live processes stay; a normal exit removes its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from mirrorline import scratch

CHILD = """
import sys, time
from mirrorline import scratch
d = scratch.mkdtemp("net-")
open(d + "/rows.parquet", "w").write("x" * 1000)
print(d, flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
"""


def child(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line, "the child printed no folder"
    return p, Path(line)


def test_a_killed_process_leaves_its_folder_and_the_next_one_removes_it(tmp_path: Path) -> None:
    killed, killed_dir = child(tmp_path, "wait")
    alive, alive_dir = child(tmp_path, "wait")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert (killed_dir / "rows.parquet").exists()  # nothing could clean up after SIGKILL
        root = tmp_path / "mirrorline-scratch"
        assert killed_dir.parent.parent == root
        removed = scratch.sweep(root)
        assert removed == [killed_dir.parent]
        assert not killed_dir.exists()
        assert (alive_dir / "rows.parquet").exists()  # its process still holds the lock
        # and a new process sweeps on its first use without being asked
        alive.send_signal(signal.SIGKILL)
        alive.wait()
        done, done_dir = child(tmp_path, "exit")
        done.wait()
        assert not alive_dir.exists()
        assert not done_dir.exists()  # a normal exit removes its own folder
        assert list(root.iterdir()) == []
    finally:
        for p in (killed, alive):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_one_folder_per_process() -> None:
    a, b = scratch.mkdtemp("x-"), scratch.mkdtemp("y-")
    assert Path(a).parent == Path(b).parent == scratch.folder()
    assert (scratch.folder() / ".owner").exists()
    os.rmdir(a)
    os.rmdir(b)


def test_an_unusable_tmpdir_is_a_clear_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    code = (
        "from mirrorline import scratch\nfrom mirrorline.errors import MirrorlineError\n"
        "try:\n    scratch.folder()\nexcept MirrorlineError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(not_a_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "cannot make a scratch folder under" in out.stdout and "set TMPDIR to a writable folder" in out.stdout


def test_the_default_root_must_be_the_users_own(tmp_path: Path) -> None:
    """The shared temporary folder's ``mirrorline-scratch`` is refused when others may write in it or it is a link
    (another user could swap a process's folder for one of theirs); a folder of the user's own is taken."""
    import pytest

    from mirrorline.errors import MirrorlineError

    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    scratch._check_own(own)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(MirrorlineError, match="not this user's own"):
        scratch._check_own(shared)
    link = tmp_path / "link"
    link.symlink_to(own)
    with pytest.raises(MirrorlineError, match="not this user's own"):
        scratch._check_own(link)
