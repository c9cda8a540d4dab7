"""Scratch copies of the tree for the recipe tests (tests/test_recipes.py): the recipes of
docs/architecture.md are followed literally in a copy, and the copy's own checks run in a fresh
interpreter that imports kvbench from the copy (harness/ as kvbench, kernels/ as kvbench.kernels,
as pyproject's package-dir maps them), never from this checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info")
# imports kvbench from the copy at sys.argv[1], then runs the code that follows
MOUNT = """
import importlib.util, sys
root = sys.argv.pop(1)
def spec(name, where):
    return importlib.util.spec_from_file_location(
        name, f"{root}/{where}/__init__.py", submodule_search_locations=[f"{root}/{where}"])
top, low = spec("kvbench", "harness"), spec("kvbench.kernels", "kernels")
pkg, kern = importlib.util.module_from_spec(top), importlib.util.module_from_spec(low)
sys.modules["kvbench"], sys.modules["kvbench.kernels"] = pkg, kern
pkg.kernels = kern
low.loader.exec_module(kern)
top.loader.exec_module(pkg)
"""


def scratch_copy(tmp: Path) -> Path:
    """A copy of the tree's code, suites, tests, docs (not their data) and pyproject under
    tmp/tree."""
    root = tmp / "tree"
    for folder in ("harness", "kernels", "suites", "tests"):
        shutil.copytree(ROOT / folder, root / folder, ignore=SKIP)
    shutil.copytree(ROOT / "docs", root / "docs", ignore=shutil.ignore_patterns("data"))  # 5 MB
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def pytest_in(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """pytest of the copy's tests (args: test files and options), kvbench from the copy."""
    code = (
        MOUNT
        + "import pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *sys.argv[1:]]))"
    )
    return subprocess.run([sys.executable, "-c", code, str(root), *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def recipe(name: str) -> str:
    """The text of docs/architecture.md's recipe `### <name>` (up to the next heading)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(rf"^### {re.escape(name)}\n(.*?)(?=^##)", text, re.S | re.M)
    assert m, f"docs/architecture.md has no recipe '### {name}'"
    return m.group(1)


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def insert_after(path: Path, anchor: str, text: str) -> None:
    """text inserted after the first line containing `anchor` (the recipe's 'one line in')."""
    lines = path.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if anchor in line)
    lines.insert(i + 1, text)
    path.write_text("".join(lines))


def kvbench_in(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The kvbench command line of the copy (`kvbench ARGS`)."""
    code = MOUNT + "from kvbench.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, str(root), *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def result_rows(out: Path):
    """The rows of the one run written under `out` (its results CSV, not samples or tokens)."""
    import pandas as pd

    (csv,) = [p for p in out.glob("*.csv") if p.name.count(".") == 1]
    return pd.read_csv(csv)
