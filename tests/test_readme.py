"""The README: at most 15 KB, and every command it shows is run here (issue 44 item 10); the
column reference (docs/columns.md, moved from the README) documents every CSV column.

Commands are the lines of the README's ```sh blocks. `kvbench plan` is run as written and its
output must equal the block that follows it (plan is exact: bytes by formula); `kvbench run`
is run with --dry-run (a real run takes minutes: the dry run checks that the command line
parses and every case resolves); `make` targets must exist in the Makefile; other kvbench
commands are checked to parse (`--help` of the subcommand) when they need files or a network.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.store.schema import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAX_README_BYTES = 15_000


def test_every_column_is_documented():
    text = (ROOT / "docs" / "columns.md").read_text()
    assert [c for c in COLUMNS if c not in text] == []


def test_readme_is_at_most_15kb():
    assert len(README.encode()) <= MAX_README_BYTES


def blocks() -> list[tuple[str, str]]:
    """(sh block, the plain block right after it or '') in order."""
    parts = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
    out = []
    for i, (lang, body) in enumerate(parts):
        if lang == "sh":
            nxt = parts[i + 1] if i + 1 < len(parts) and parts[i + 1][0] == "" else ("", "")
            out.append((body, nxt[1]))
    return out


def commands() -> list[tuple[list[str], str]]:
    out = []
    for body, following in blocks():
        lines = [x.split("#")[0].strip() for x in body.splitlines()]
        lines = [x for x in lines if x]
        for x in lines:
            out.append((shlex.split(x), following if len(lines) == 1 else ""))
    return out


def test_the_readme_shows_commands():
    assert any(argv[:2] == ["kvbench", "run"] for argv, _ in commands())
    assert any(argv[:2] == ["kvbench", "plan"] for argv, _ in commands())


@pytest.mark.parametrize(
    "argv, shown", commands(), ids=lambda x: " ".join(x)[:60] if isinstance(x, list) else ""
)
def test_each_readme_command_runs(argv, shown, capsys, tmp_path, monkeypatch):
    if argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert argv[1] in targets
        return
    assert argv[0] == "kvbench", argv
    args = argv[1:]
    if args[0] == "run":
        monkeypatch.chdir(ROOT)
        assert main([*args, "--dry-run", "--out", str(tmp_path)]) == 0
    elif args[0] == "plan":
        assert main(args) == 0
        got = capsys.readouterr().out.strip()
        if shown:
            assert got == shown.strip()
    elif args[0] in ("list", "env"):
        assert main(args) == 0
    else:  # needs files a run writes, or the network: the command line must parse
        with pytest.raises(SystemExit) as e:
            main([args[0], "--help"])
        assert e.value.code == 0
