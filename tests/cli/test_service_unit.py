"""contrib/systemd/mirrorline.service does what it says: systemd accepts it, and its commands run as systemd runs
them (the environment and secrets file it names, ExecStart, ExecReload's signal, KillSignal within TimeoutStopSec)
keep a target current, take a target added to the configuration up, and stop cleanly with a status systemd counts as
success; a configuration error's exit status is one the unit does not restart on."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from waiting import wait_until

from mirrorline.errors import ConfigError

pytestmark = [pytest.mark.pg, pytest.mark.spark]

UNIT = Path(__file__).resolve().parents[2] / "contrib" / "systemd" / "mirrorline.service"
MIRRORLINE = Path(sys.executable).with_name("mirrorline")


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def _environment(service: Any, etc: Path) -> dict[str, str]:
    """The unit's Environment= and EnvironmentFile= as systemd reads them, /etc/mirrorline moved to ``etc``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIRRORLINE_")}
    key, _, value = service["Environment"].partition("=")
    env[key] = value.replace("/etc/mirrorline", str(etc))
    secrets = Path(service["EnvironmentFile"].lstrip("-").replace("/etc/mirrorline", str(etc)))
    for line in secrets.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k.strip()] = v.strip()
    return env


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    text = UNIT.read_text().replace("/opt/mirrorline/bin/mirrorline", str(MIRRORLINE))
    unit = tmp_path / "mirrorline.service"
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_the_units_commands_run_reload_and_stop_as_systemd_runs_them(pg: Any, tmp_path: Path) -> None:
    service = _unit()["Service"]
    assert service["ExecStart"].split()[0] == "/opt/mirrorline/bin/mirrorline"
    assert int(service["RestartPreventExitStatus"]) == ConfigError.exit_code  # a wrong file is not restarted
    role = "svc_" + uuid.uuid4().hex[:8]
    pg.execute(
        f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pw-of-the-service';"
        "CREATE TABLE public.items (id integer PRIMARY KEY, v text); INSERT INTO public.items VALUES (1, 'a');"
        f"ALTER TABLE public.items OWNER TO {role}; GRANT CREATE ON DATABASE {pg.name} TO {role}"
    )
    etc, home = tmp_path / "etc", tmp_path / "var"
    etc.mkdir()
    home.mkdir()
    (etc / "secrets.env").write_text("# read by systemd\nSVC_PASSWORD=pw-of-the-service\n")
    dsn = f"host=127.0.0.1 port={pg.cluster.port} dbname={pg.name} user={role} password=${{SVC_PASSWORD}}"
    urls = {"cache": f"sqlite:///{home / 'cache.db'}", "late": f"sqlite:///{home / 'late.db'}"}

    def write(names: list[str]) -> None:
        configs.write(
            etc / "mirrorline.toml",
            source=dsn,
            log=home / "log",
            apply={"latency": "100ms"},
            tables=["public.items"],
            targets={n: urls[n] for n in names},
        )

    write(["cache"])
    env = _environment(service, etc)
    start = [str(MIRRORLINE), *shlex.split(service["ExecStart"])[1:]]
    out = tmp_path / "journal.log"
    with open(out, "ab") as journal:
        proc = subprocess.Popen(start, cwd=home, env=env, stdout=journal, stderr=journal)
    try:
        wait_until(lambda: _same(pg, urls["cache"]), timeout=180, what="the target is loaded")
        write(["cache", "late"])
        reload = shlex.split(service["ExecReload"].replace("$MAINPID", str(proc.pid)))
        assert subprocess.run(reload).returncode == 0
        pg.execute("UPDATE public.items SET v = 'b'")
        wait_until(lambda: _same(pg, urls["cache"]) and _same(pg, urls["late"]), timeout=180, what="the added target")
    finally:
        proc.send_signal(getattr(signal, service["KillSignal"]))
        code = proc.wait(float(service["TimeoutStopSec"]))
        pg.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")
    journal_text = out.read_text()
    assert code == 0, journal_text
    assert "pw-of-the-service" not in journal_text


def _same(pg: Any, url: str) -> bool:
    try:
        oracle.assert_same(pg.dsn, "sqlite", url, "public.items")
    except Exception:
        return False
    return True
