"""``./dev install DIR``, the install for your own database: a virtual environment holding mirrorline alone (no
PostgreSQL server, no test tools), whose ``mirrorline`` replicates a source. The dependencies are lent from the test
run's environment (``--no-deps`` and a path file) so that the test downloads nothing; mirrorline itself is the
package built and installed from this checkout, not the editable one."""

from __future__ import annotations

import os
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest

pytestmark = [pytest.mark.pg, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]


def test_dev_install_gives_a_mirrorline_that_replicates(pg: Any, tmp_path: Path) -> None:
    into = tmp_path / "opt"
    env = {**os.environ, "MIRRORLINE_PIP_ARGS": "--no-deps"}
    r = subprocess.run([str(REPO / "dev"), "install", str(into)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert f"install: {into}/bin/mirrorline" in r.stdout
    python = into / "bin" / "python"
    lib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(lib, "lent-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run(
        [str(python), "-c", "import mirrorline; print(mirrorline.__file__)"], capture_output=True, text=True, check=True
    ).stdout
    assert where.startswith(str(into)), where  # the installed package, not this checkout's

    pg.execute("CREATE TABLE public.items (id int PRIMARY KEY, v text); INSERT INTO public.items VALUES (1, 'a')")
    cfg = tmp_path / "m.toml"
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    configs.write(cfg, source=pg.dsn, log=tmp_path / "log", tables=["public.items"], targets={"cache": url})
    # no PostgreSQL binaries on the path: mirrorline needs a server only to replicate from
    path = ":".join(p for p in os.environ["PATH"].split(":") if "postgresql" not in p)
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MIRRORLINE_PG_BINDIR")}
    run_env["PATH"] = path
    run_env["MIRRORLINE_SPARK_DRIVER_MEMORY"] = "1g"
    r = subprocess.run(
        [str(into / "bin" / "mirrorline"), "run", "--once", "-c", str(cfg)], capture_output=True, text=True, env=run_env
    )
    assert r.returncode == 0, r.stderr
    pg.execute("UPDATE public.items SET v = 'b'; INSERT INTO public.items VALUES (2, 'c')")
    r = subprocess.run(
        [str(into / "bin" / "mirrorline"), "run", "--once", "-c", str(cfg)], capture_output=True, text=True, env=run_env
    )
    assert r.returncode == 0, r.stderr
    oracle.assert_same(pg.dsn, "sqlite", url, "public.items")
