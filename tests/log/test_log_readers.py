"""Targets come and go: a target removed from the configuration keeps holding the log until it is dropped
(`mirrorline target drop`, or `run --forget-removed`), with a warning in `status`; an export folder never loaded
stops holding the log after the log's `export_expiry`, with a warning the day before."""

from __future__ import annotations

import time
from pathlib import Path

import configs
import pytest

from mirrorline import config as C
from mirrorline.cli.main import main
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log.retention import expire_exports, readers, retain, set_applied, unconfigured
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.pipeline import Runner
from mirrorline.position import ZERO, Position
from mirrorline.status import status


def _config(tmp_path: Path, targets: list[str], expiry: str = "7d", **log: str) -> C.Config:
    """``log``: more settings of the log."""
    return configs.load(
        tmp_path / "m.toml",
        source="host=127.0.0.1 port=1 dbname=nowhere connect_timeout=1",
        log={"path": "log", "export_expiry": expiry, **log},
        tables=["public.t"],
        targets={n: f"sqlite:///{tmp_path / (n + '.db')}" for n in targets},
    )


def _log(root: Path) -> list[Position]:
    """Three segments of one change each; their positions."""
    with LogWriter(root, segment_changes=1) as w:
        w.record_schema(TableSchema("public.t", (Column("id", "integer", nullable=False),), ("id",)))
        for i in range(1, 4):
            w.add_transaction(
                0x10 * i,
                1_700_000_000_000_000 + i,
                [Change(ZERO, 0, i, "public.t", Op.INSERT, (str(i),), {"id": str(i)})],
            )
    return [c.pos for c in ChangeLog(root).read()]


def test_a_removed_target_holds_the_log_until_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, ["cache"])
    pos = _log(cfg.log.path)
    cl = ChangeLog(cfg.log.path)
    set_applied(cl, "cache", pos[2])
    set_applied(cl, "old", pos[0])  # a target since removed from the configuration
    assert list(unconfigured(cl, cfg.targets)) == ["old"]
    assert len(retain(cl)) == 1 and cl.count() == 2  # "old" keeps what it has not applied
    warnings = status(cfg).warnings
    assert any("target old is no longer configured" in w and "mirrorline target drop old" in w for w in warnings)

    assert main(["target", "list", "-c", str(tmp_path / "m.toml")]) == 0
    out = capsys.readouterr().out
    assert "cache\t" in out and "old\t" in out and "removed target" in out
    assert main(["target", "drop", "-c", str(tmp_path / "m.toml"), "cache"]) == 2  # still configured
    assert "still configured" in capsys.readouterr().err
    assert main(["target", "drop", "-c", str(tmp_path / "m.toml"), "nope"]) == 3
    assert "no target nope is registered" in capsys.readouterr().err
    assert main(["target", "drop", "-c", str(tmp_path / "m.toml"), "old"]) == 0
    assert "target old unregistered" in capsys.readouterr().err
    assert list(readers(cl)) == ["cache"]
    retain(cl)
    assert cl.count() == 0  # retention moved on: everything was applied by the only reader left
    assert not any("no longer configured" in w for w in status(cfg).warnings)


def test_run_forgets_removed_targets_only_when_told(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config(tmp_path, ["cache"])
    pos = _log(cfg.log.path)
    cl = ChangeLog(cfg.log.path)
    set_applied(cl, "old", pos[0])
    set_applied(cl, "export-x", pos[0])
    Runner(cfg)._removed_targets()
    assert "old" in readers(cl) and "mirrorline target drop old" in caplog.text
    said: list[str] = []
    Runner(cfg, forget_removed=True, on_message=said.append)._removed_targets()
    assert sorted(readers(cl)) == ["export-x"]  # an export folder is not a removed target
    assert said == ["target old (no longer configured) unregistered: the log no longer keeps its changes"]


def test_an_export_folder_not_loaded_expires(tmp_path: Path) -> None:
    cfg = _config(tmp_path, ["cache"], expiry="2d")
    pos = _log(cfg.log.path)
    cl = ChangeLog(cfg.log.path)
    set_applied(cl, "cache", pos[2])
    set_applied(cl, "export-a", pos[0])
    now = time.time()
    assert expire_exports(cl, cfg.log.export_expiry, now=now + 86_400) == []  # a day old: kept ...
    warnings = status(cfg).warnings
    assert not any("export-a" in w for w in warnings)
    from mirrorline.status import Status, _warn_readers

    st = Status()
    _warn_readers(cfg, st, cl, now=now + 1.5 * 86_400)  # ... with a warning the day before it expires
    assert any("export-a has not been loaded: in 12.0 h" in w for w in st.warnings), st.warnings
    assert expire_exports(cl, cfg.log.export_expiry, now=now + 2.1 * 86_400) == ["export-a"]
    assert list(readers(cl)) == ["cache"]
    assert expire_exports(cl, 0, now=now + 1e9) == []  # 0: never
    retain(cl)
    assert cl.count() == 0


def test_export_expiry_is_validated(tmp_path: Path) -> None:
    with pytest.raises(C.ConfigError, match="export_expiry"):
        _config(tmp_path, ["cache"], expiry="soon")


def test_the_log_cap_leaves_a_target_behind_needing_a_reload(tmp_path: Path) -> None:
    """[log] max_age / max_size: the changes past the cap are removed even though a target has not applied them;
    that target is marked as needing a reload (snapshot --target), apply refuses it, the others go on."""
    from mirrorline.errors import MirrorlineError
    from mirrorline.log.retention import clear_reload, needs_reload
    from mirrorline.pipeline import Applier

    cfg = _config(tmp_path, ["cache", "slow"])
    pos = _log(cfg.log.path)  # commit times 1_700_000_000 s + 1, 2, 3 µs
    cl = ChangeLog(cfg.log.path)
    set_applied(cl, "cache", pos[2])
    set_applied(cl, "slow", pos[0])
    first = cl.segments()[0].name
    assert retain(cl, max_age=3600, now=1_700_000_000 + 1800) == [first]  # all within the cap: what slow applied
    assert needs_reload(cl) == {}
    removed = retain(cl, max_age=3600, now=1_700_000_000 + 7200)  # every change older than the cap
    assert len(removed) == 2 and cl.count() == 0
    assert list(needs_reload(cl)) == ["slow"] and list(readers(cl)) == ["cache"]
    assert needs_reload(cl)["slow"]["applied"] == str(pos[0])
    with pytest.raises(MirrorlineError, match="target slow needs a reload") as e:
        Applier(cfg, ["slow"], open_targets=False, spark=object())
    assert "snapshot --target slow" in str(e.value)
    assert Applier(cfg, open_targets=False, spark=object()).names == ["cache"]
    clear_reload(cl, "slow")  # what a snapshot of the target does once loaded
    assert needs_reload(cl) == {}


def test_the_log_cap_by_size(tmp_path: Path) -> None:
    from mirrorline.log.retention import needs_reload

    cfg = _config(tmp_path, ["cache"])
    pos = _log(cfg.log.path)
    cl = ChangeLog(cfg.log.path)
    set_applied(cl, "cache", pos[0])
    sizes = [sum(f.stat().st_size for f in [s.path] if f.is_file()) for s in cl.segments()]
    assert retain(cl, max_size=sizes[-1] + 1) and cl.count() == 1  # only the newest segment fits
    assert list(needs_reload(cl)) == ["cache"]


def test_log_cap_settings_are_validated(tmp_path: Path) -> None:
    c = _config(tmp_path, ["cache"], max_age="30d", max_size="2GB")
    assert (c.log.max_age, c.log.max_size) == (30 * 86_400, 2 << 30)
    with pytest.raises(C.ConfigError, match="max_size"):
        _config(tmp_path, ["cache"], max_age="30d", max_size="lots")


def test_the_warm_up_builds_the_plan_for_the_pipelines_tables_without_a_key(tmp_path: Path) -> None:
    """The small-unit plan is built for the pipeline's bag tables: the warm-up (before any unit) and the pipeline
    take them from the log's schemas, so that they build the same plan."""
    from mirrorline.pipeline import Applier, known_bags

    cfg = _config(tmp_path, ["cache"])
    assert known_bags(cfg) == {}  # no log yet
    cols = (Column("a", "integer"), Column("note", "text"))
    with LogWriter(cfg.log.path) as w:
        w.record_schema(TableSchema("public.t", cols, ("a", "note"), bag=True))
        w.record_schema(TableSchema("public.other", cols, ("a", "note"), bag=True))  # not configured
    assert known_bags(cfg) == {"public.t": ("a", "note")}
    compiler = Applier(cfg, open_targets=False, spark=object()).compiler
    assert compiler.bags([], ZERO, ZERO) == {"public.t": ("a", "note")}
