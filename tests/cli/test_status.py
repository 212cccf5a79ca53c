"""Status figures: warnings for a slow target and a growing slot, and the Prometheus text exposition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import configs

from mirrorline import config as C
from mirrorline.position import Position
from mirrorline.status import Status, TargetStatus, _warn, render_prometheus, write_prometheus


def _status() -> Status:
    return Status(
        source="host=x",
        slot="mirrorline",
        current_lsn=5 << 30,
        slot_confirmed_lsn=1 << 20,
        slot_retained_bytes=3 << 30,
        log_durable=Position(4 << 30, 2),
        log_bytes=2 << 30,
        log_segments=9,
        targets=[
            TargetStatus("fast", "sqlite", "live", Position(4 << 30, 2), 0.0, 0),
            TargetStatus("slow", "postgresql", "catching up", Position(1 << 20, 0), 900.0, (5 << 30) - (1 << 20)),
        ],
    )


def test_warnings_name_the_slow_target_and_the_slot(tmp_path: Path) -> None:
    st = _status()
    cfg = C.parse({}, tmp_path / "x.toml")
    _warn(cfg, st)
    assert any("target slow" in w and "log keeps everything" in w for w in st.warnings)
    assert any("slot mirrorline retains 3.0 GB" in w for w in st.warnings)
    assert "warning: target slow" in st.text()
    assert any("target slow" in w and "the log has no cap" in w for w in st.warnings)
    capped = C.parse({"log": {"max_age": "1h", "max_size": "8GB"}}, tmp_path / "x.toml")
    st = _status()
    _warn(capped, st)
    (slow,) = [w for w in st.warnings if "target slow" in w]
    assert "max_age (60 min) removes its oldest change in 45 min" in slow, slow  # (900 s behind)
    assert "once the log holds 8.0 GB (now 2.0 GB, 25%)" in slow, slow


def test_the_time_until_the_logs_cap_applies() -> None:
    from mirrorline.status import cap_note

    assert cap_note(0, 0, 100.0, 1 << 20).startswith("the log has no cap")
    assert cap_note(30 * 86_400, 0, 2.5 * 86_400, 0) == (
        "then it needs a reload: max_age (30.0 d) removes its oldest change in 27.5 d"
    )
    assert "in 0 s" in cap_note(3600, 0, 7200, 0)  # past it already: at the next retention
    assert "max_age (60 min) then removes what it still needs" in cap_note(3600, 0, None, 0)


def test_prometheus_text(tmp_path: Path) -> None:
    st = _status()
    text = render_prometheus(st)
    assert "# TYPE mirrorline_target_lag_seconds gauge" in text
    assert 'mirrorline_target_lag_seconds{target="slow"} 900.0' in text
    assert 'mirrorline_target_state{target="slow",state="catching up"} 1' in text
    assert 'mirrorline_target_state{target="slow",state="live"} 0' in text
    assert f'mirrorline_slot_retained_wal_bytes{{slot="mirrorline"}} {3 << 30}' in text
    for line in text.strip().splitlines():  # every sample line is "name{labels} value" or "name value"
        assert line.startswith("#") or line.rsplit(" ", 1)[1].replace(".", "").isdigit()
    write_prometheus(st, tmp_path / "m.prom")
    assert (tmp_path / "m.prom").read_text() == text
    assert st.to_json()["targets"][1]["lag_bytes"] == (5 << 30) - (1 << 20)


def test_problems_are_what_makes_replication_unhealthy() -> None:
    st = _status()
    assert st.problems() == [] and st.problems(max_lag=1000) == []
    assert st.problems(max_lag=30) == ["target slow is 900.0 s behind (more than 30 s)"]
    st.targets[0].error = "cannot open SQLite database x.db"
    st.errors.append("source: connection refused")
    assert st.problems() == ["source: connection refused", "target fast: cannot open SQLite database x.db"]


def test_status_check_is_critical_when_the_source_cannot_be_reached(tmp_path: Path, capsys: object) -> None:
    import socket

    from mirrorline.cli.main import main

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = configs.write(
        tmp_path / "m.toml",
        source=f"host=127.0.0.1 port={port} user=nobody password=s3cret dbname=x connect_timeout=2",
        log=tmp_path / "log",
        targets={"lite": "sqlite:///lite.db"},
    )
    assert main(["status", "-c", str(conf), "--check"]) == 2  # Nagios: CRITICAL
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert out.startswith("CRITICAL: source:") and len(out.strip().splitlines()) == 1 and "s3cret" not in out
    assert main(["status", "-c", str(conf)]) == 1  # without --check: unhealthy
    assert main(["status", "-c", str(conf), "--max-lag", "soon"]) == 2
    # a configuration that cannot be read: UNKNOWN
    capsys.readouterr()  # type: ignore[attr-defined]
    assert main(["status", "-c", str(tmp_path / "missing.toml"), "--check"]) == 3
    assert capsys.readouterr().out.startswith("UNKNOWN: ")  # type: ignore[attr-defined]


def test_status_check_warns_beyond_warn_lag_and_on_status_warnings(monkeypatch: Any, capsys: Any) -> None:
    from mirrorline import status as status_mod
    from mirrorline.cli import status_cmd
    from mirrorline.cli.main import build_parser

    st = _status()  # targets "fast" (live) and "slow" (900 s behind)
    monkeypatch.setattr(status_mod, "status", lambda config: st)
    monkeypatch.setattr(status_cmd, "load_config", lambda args: None)

    def check(*more: str) -> tuple[int, str]:
        code = status_cmd.run(build_parser().parse_args(["status", "--check", *more]))
        return code, capsys.readouterr().out

    assert check() == (0, "OK: lag fast 0.0 s, slow 900.0 s\n")
    code, out = check("--warn-lag", "60s")
    assert code == 1 and out.startswith("WARNING: target slow is 900.0 s behind (more than 60 s)")
    code, out = check("--warn-lag", "60s", "--max-lag", "10m")
    assert code == 2 and out.startswith("CRITICAL: target slow is 900.0 s behind (more than 600 s)")
    st.warnings.append("slot mirrorline retains 3.0 GB of WAL on the source")
    code, out = check()
    assert code == 1 and out == "WARNING: slot mirrorline retains 3.0 GB of WAL on the source\n"
