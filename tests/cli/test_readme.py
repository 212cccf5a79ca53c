"""The README cannot drift from the code: its two commands are the ones ./dev and CI run; every command line it names
parses as the CLI reads it; the configuration reference loads, each commented key too; "Prepare the source"'s SQL
and the configuration reference, run against a throwaway source (its DSN and the PostgreSQL target's URL the only
things changed), replicate into all four of its targets; and the "Query the replica" reads it shows work on them."""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import oracle
import pytest

from mirrorline import config as C
from mirrorline.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    """The fenced code blocks of one language, their indentation removed."""
    out = []
    for m in re.finditer(r"^( *)```" + lang + r"\n(.*?)^\1```", README, re.S | re.M):
        indent = len(m.group(1))
        out.append("\n".join(line[indent:] for line in m.group(2).splitlines()))
    return out


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


# ----------------------------------------------------------------------------------------------- the two commands


def test_the_readme_starts_with_the_two_commands_ci_runs() -> None:
    first = README.split("```sh\n", 1)[1].split("```", 1)[0]
    assert README.startswith("# mirrorline\n\n```sh\n")  # nothing before them
    commands = [line.split("#")[0].strip() for line in first.strip().splitlines()]
    assert commands == ["./dev demo", "./dev test"]
    dev = (REPO / "dev").read_text()
    assert "    demo) setup; exec" in dev and "    test)\n        setup\n        lint" in dev
    assert "./dev test" in (REPO / ".ci" / "run").read_text()


# ----------------------------------------------------------------------------------------------- command lines

_PLACEHOLDERS = {
    "POS|TIME|C:S": "0/16B6C50",
    "DIR/EXPORT": "/tmp/exports/e1",
    "FILE...": "changes.jsonl",
    "DURATION": "5m",
    "NAME": "cache",
    "DIR": "/tmp/exports",
    "T": "public.orders",
    "N": "3",
    "CONFIG": "m.toml",
}


def _fill(text: str) -> str:
    for k, v in _PLACEHOLDERS.items():
        text = re.sub(r"(?<![\w-])" + re.escape(k) + r"(?![\w-])", v, text)
    return text


def _groups(synopsis: str) -> tuple[list[str], list[list[str]]]:
    """A synopsis -> its words outside brackets and, per top-level bracket group, its alternatives (nested brackets
    kept inside an alternative, then opened)."""
    words: list[str] = []
    groups: list[list[str]] = []
    depth, cur = 0, ""
    for ch in synopsis:
        if ch == "[":
            if depth:
                cur += ch
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth:
                cur += ch
            else:
                groups.append([a.strip().replace("[", "").replace("]", "") for a in cur.split("|")])
                cur = ""
        elif depth:
            cur += ch
        else:
            words.append(ch)
    return "".join(words).split(), groups


def _command_lines() -> list[list[str]]:
    spans = re.findall(r"`((?:mirrorline|\./dev mirrorline) [^`]+)`", README)
    table = _section("Operating it").split("| command | does |", 1)[1].split("\n\n", 1)[0]
    for row in table.splitlines()[2:]:
        spans += [s for s in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    out = []
    for span in spans:
        span = _fill(span.replace("\\|", "|"))
        span = re.sub(r"^(\./dev )?mirrorline ", "", span)
        if span.startswith(("COMMAND", "-c m.toml COMMAND")):
            continue
        words, groups = _groups(span)
        out.append(words)
        for g in groups:  # each alternative of each option alone
            out += [words + shlex.split(alt) for alt in g]
        if groups:
            out.append(words + list(itertools.chain.from_iterable(shlex.split(g[0]) for g in groups)))
    return out


def test_every_command_line_in_the_readme_parses() -> None:
    lines = _command_lines()
    assert len(lines) > 30
    named = {line[0] for line in lines}
    assert {"run", "capture", "status", "verify", "snapshot", "teardown", "reload", "target", "log"} <= named
    parser = build_parser()
    for argv in lines:
        try:
            parser.parse_args(["-c", "m.toml", *argv])
        except SystemExit as e:
            pytest.fail(f"README's `mirrorline {' '.join(argv)}` does not parse (exit {e.code})")


# ----------------------------------------------------------------------------------------------- configuration


def _reference() -> str:
    (block,) = [b for b in _blocks("toml") if b.startswith("[source]\ndsn =") and "[targets.ice]" in b]
    return block


def test_the_quick_starts_configuration_loads(tmp_path: Path) -> None:
    (block,) = [b for b in _blocks("toml") if b.startswith("[source]\ndsn =") and "[targets.ice]" not in b]
    p = tmp_path / "mirrorline.toml"
    p.write_text(block)
    cfg = C.load(p)
    assert list(cfg.tables) == ["public.orders", "public.customers"] and list(cfg.targets) == ["cache"]


def _variants(text: str) -> list[str]:
    """The reference with each commented key uncommented in its place (replacing the same key where it is set), and
    each commented section uncommented whole."""
    lines = text.splitlines()
    out = []
    section = ""
    skip_until = 0  # the keys of a commented section go with it
    for i, line in enumerate(lines):
        if i < skip_until:
            continue
        if re.match(r"^\[", line):
            section = line
        m = re.match(r"^# (\[[^\]]+\])", line)
        if m:  # a commented section: it and its commented keys
            j = i + 1
            while j < len(lines) and re.match(r"^# [\w\"]", lines[j]):
                j += 1
            body = [ln[2:] if ln.startswith("# ") else ln for ln in lines[i:j]]
            out.append("\n".join(lines[:i] + body + lines[j:]))
            skip_until = j
            continue
        m = re.match(r"^# ([a-z_]+) = ", line)
        if m:
            key = m.group(1)
            start = max(k for k, ln in enumerate(lines[: i + 1]) if ln.startswith("[")) if section else 0
            new = [ln for k, ln in enumerate(lines) if not (k >= start and k < i and ln.startswith(f"{key} = "))]
            idx = new.index(line)
            new[idx] = line[2:]
            out.append("\n".join(new))
    return out


def test_the_configuration_reference_loads_and_so_does_each_commented_key(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("APP_PASSWORD", "pw")
    monkeypatch.setenv("ICEBERG_CREDENTIAL", "id:secret")
    text = _reference()
    p = tmp_path / "m.toml"
    p.write_text(text)
    cfg = C.load(p)
    assert set(cfg.targets) == {"cache", "warehouse", "lake", "ice"}
    variants = _variants(text)
    assert len(variants) >= 25
    for v in variants:
        p.write_text(v)
        try:
            C.load(p)
        except Exception as e:  # the commented line is named by the failure
            changed = next(a for a, b in zip(v.splitlines(), text.splitlines(), strict=False) if a != b)
            pytest.fail(f"README's configuration with `{changed}` uncommented does not load: {e}")


def test_the_spark_cluster_snippet_loads(tmp_path: Path) -> None:
    (block,) = [b for b in _blocks("toml") if "[spark]" in b]
    p = tmp_path / "m.toml"
    p.write_text('[source]\ndsn = "host=db"\n[tables."public.t"]\n[targets.x]\nurl = "sqlite:///x.db"\n' + block)
    cfg = C.load(p)
    assert cfg.spark.master == "spark://spark-master.example:7077"


# ------------------------------------------------------------------------- the snippets against a real source


@pytest.mark.pg
@pytest.mark.spark
def test_prepare_the_source_and_the_reference_configuration_replicate(
    pg_cluster_factory: Any, pg_cluster: Any, tmp_path: Path, target_dbs: list[str]
) -> None:
    source = pg_cluster_factory()
    source.execute(
        "CREATE TABLE public.customers (id int PRIMARY KEY, name text);"
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, customer int, amount numeric(10,2), region text);"
        "INSERT INTO public.customers SELECT g, 'c' || g FROM generate_series(1, 50) g;"
        "INSERT INTO public.orders SELECT g, g % 50 + 1, g * 1.25, (ARRAY['eu','uk','us'])[g % 3 + 1] "
        "FROM generate_series(1, 500) g"
    )
    (sql,) = _blocks("sql")
    source.execute(sql)  # "Prepare the source", as a superuser
    target_dbs.append("readme_dw")
    pg_cluster.create_database("readme_dw")
    text = _reference()
    text = text.replace('"postgresql://app@db.example:5432/app"', f'"{source.dsn()} user=replicator"', 1)
    text = text.replace('"postgresql://dw@warehouse.example/dw"', f'"{pg_cluster.url("readme_dw")}"', 1)
    # the first start's snapshot loads by sequence; the quick start's tables are replicated as configured
    text = text.replace('[tables."public.orders"]', '[tables."public.customers"]\n[tables."public.orders"]', 1)
    (tmp_path / "mirrorline.toml").write_text(text)

    def mirrorline(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mirrorline.cli.main", *args], cwd=tmp_path, capture_output=True, text=True
        )

    r = mirrorline("run", "--once")
    assert r.returncode == 0, r.stderr
    source.execute(
        "UPDATE public.orders SET amount = amount + 1 WHERE id % 7 = 0; DELETE FROM public.orders WHERE id < 20"
    )
    r = mirrorline("run", "--once")
    assert r.returncode == 0, r.stderr
    urls = {
        "sqlite": f"sqlite:///{tmp_path / 'cache.db'}",
        "postgresql": pg_cluster.url("readme_dw"),
        "delta": f"delta:///{tmp_path / 'lake'}",
        "iceberg": f"iceberg:///{tmp_path / 'ice'}",
    }
    for kind, url in urls.items():
        for table in ("public.orders", "public.customers"):
            oracle.assert_same(source.dsn(), kind, url, table)
    r = mirrorline("verify")
    assert r.returncode == 0, r.stdout + r.stderr

    # "Query the replica": the reads it shows for the table formats, run where the configuration is
    reads = re.findall(r'`(python -c "[^`]+")`', _section("Query the replica"))
    assert len(reads) == 2
    (count,) = source.execute("SELECT count(*) FROM public.orders")[0]
    for read in reads:
        argv = shlex.split(read)
        argv[0] = sys.executable
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.strip() == str(count), (read, r.stderr)
