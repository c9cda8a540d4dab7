"""The walls of the design (docs/architecture.md), proven by walking the packages:

* store/, analysis/ and report/ (and the root modules they use) import neither mlx nor
  kernels/ nor spec/, engines/ or run/: results are compared and plotted from files alone;
* kernels/ never imports the instrument (any `kvbench.*` module outside kvbench.kernels);
* `kvbench compare/history/report/import` run in a process where importing mlx raises.
Each module is imported in a fresh interpreter with an import hook that records every module
the import pulls in, so an indirect import through a helper module is caught too.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import kvbench
import kvbench.kernels

ROOT = Path(__file__).resolve().parents[1]
FILES_ONLY = ("kvbench.store", "kvbench.analysis", "kvbench.report")
FORBIDDEN_FOR_FILES_ONLY = (
    "mlx", "kvbench.kernels", "kvbench.spec", "kvbench.engines", "kvbench.run",
)  # fmt: skip


def modules_of(package) -> list[str]:
    """Every module of a package, found by walking its folders (no hand-written list)."""
    found = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        found.append(info.name)
    return found


def loaded_by(modules: list[str]) -> list[str]:
    """Every module name that importing `modules` loads, in one fresh interpreter (if their
    union holds nothing forbidden, neither does any one of them)."""
    code = (
        "import sys, json, importlib; before = set(sys.modules); "
        f"[importlib.import_module(m) for m in {modules!r}]; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def hits(loaded: list[str], forbidden) -> list[str]:
    return [m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)]


def test_the_walk_finds_every_package_of_the_tree():
    names = set(modules_of(kvbench)) | set(modules_of(kvbench.kernels))
    for pkg in ("spec", "engines", "run", "store", "analysis", "report", "kernels"):
        assert f"kvbench.{pkg}" in names
    assert "kvbench.kernels.attention.registry" in names
    assert "kvbench.store.results" in names and "kvbench.report.page" in names


def test_files_only_packages_import_no_mlx_kernels_or_runner():
    modules = [m for p in FILES_ONLY for m in modules_of(importlib.import_module(p))]
    assert len(modules) > 10
    assert hits(loaded_by(modules), FORBIDDEN_FOR_FILES_ONLY) == []


def test_the_wall_check_would_see_a_forbidden_import():
    assert hits(loaded_by(["kvbench.run.runner"]), FORBIDDEN_FOR_FILES_ONLY) != []


def test_kernels_never_import_the_instrument():
    # one interpreter for the whole kernels package (each module's imports are a subset)
    loaded = loaded_by(modules_of(kvbench.kernels))
    instrument = [m for m in loaded if m.startswith("kvbench.") and "kvbench.kernels" not in m]
    # the parent package `kvbench` itself is loaded (it holds the version and loads the BLAS that
    # must precede mlx.core: harness/blas.py, which imports no other kvbench module), nothing else
    assert instrument == ["kvbench.blas"]


BLOCK_MLX = """
import sys, runpy
class NoMlx:
    def find_spec(self, name, path=None, target=None):
        if name == "mlx" or name.startswith("mlx."):
            raise ImportError("mlx is blocked in this process")
sys.meta_path.insert(0, NoMlx())
sys.argv = ["kvbench", *sys.argv[1:]]
runpy.run_module("kvbench", run_name="__main__", alter_sys=True)
"""


def kvbench_without_mlx(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", BLOCK_MLX, *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)


def test_the_mlx_block_really_blocks(tmp_path):
    r = kvbench_without_mlx("list", cwd=tmp_path)  # list needs mlx: it must fail
    assert r.returncode != 0 and "mlx is blocked" in r.stderr


def test_compare_history_report_import_run_without_mlx(tmp_path):
    v1 = ROOT / "tests" / "data" / "results-v1"
    r = kvbench_without_mlx("compare", str(v1), str(v1), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = kvbench_without_mlx("history", str(v1), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = kvbench_without_mlx("report", str(v1), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "r.html").stat().st_size > 0, r.stderr
    bench_json = ROOT / "tests" / "data" / "pytest-benchmark.json"
    r = kvbench_without_mlx("import", str(bench_json), "--out", str(tmp_path / "i"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# ---- the rooms (static: each module's own import statements, read from its source) ----------
# package -> packages it must not import
ROOM_RULES = {
    "kvbench.kernels": ("kvbench.spec", "kvbench.engines", "kvbench.run", "kvbench.store",
                        "kvbench.analysis", "kvbench.report", "kvbench.peers", "kvbench.cli"),
    "kvbench.kernels.formats": ("kvbench.kernels.stores", "kvbench.kernels.attention",
                                "kvbench.kernels.model"),
    "kvbench.kernels.stores": ("kvbench.kernels.attention", "kvbench.kernels.model"),
    "kvbench.spec": ("kvbench.run", "kvbench.engines", "kvbench.store"),
    "kvbench.run": ("kvbench.analysis",),
    "kvbench.store": ("kvbench.analysis",),
    "kvbench.engines.sharded_rank": ("kvbench.run",),
}  # fmt: skip
# imports that still run the wrong way, each with its reason (importer, imported prefix)
WRONG_WAY = {
    ("kvbench.kernels.stores.paged", "kvbench.kernels.attention.tiled"):
        "page_read: table folds each page into the tiled kernel's running state (fold_tile), "
        "the same code the tiled kernel runs, rather than a copy of it",
}  # fmt: skip


def module_file(name: str) -> Path:
    parts = name.split(".")
    base = ROOT / "kernels" if parts[:2] == ["kvbench", "kernels"] else ROOT / "harness"
    rest = parts[2:] if parts[:2] == ["kvbench", "kernels"] else parts[1:]
    path = base.joinpath(*rest)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports_of(name: str) -> set[str]:
    """Modules named by the import statements of one module (absolute; kvbench has no
    relative imports)."""
    import ast

    tree = ast.parse(module_file(name).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def wrong_way(rules: dict = ROOM_RULES) -> list[tuple[str, str]]:
    every = modules_of(kvbench) + modules_of(kvbench.kernels)
    bad = []
    for mod in every:
        for pkg, forbidden in rules.items():
            if mod != pkg and not mod.startswith(pkg + "."):
                continue
            for imp in imports_of(mod):
                if any(imp == f or imp.startswith(f + ".") for f in forbidden):
                    bad.append((mod, imp))
    return sorted(bad)


def _excused(mod: str, imp: str) -> bool:
    return any(mod == m and (imp == i or imp.startswith(i + ".")) for m, i in WRONG_WAY)


def test_no_room_imports_the_wrong_way():
    assert [b for b in wrong_way() if not _excused(*b)] == []


def test_every_listed_exception_still_exists():
    # an exception whose import is gone must leave the list, so the list stays the truth
    found = wrong_way()
    for mod, imp in WRONG_WAY:
        assert any(m == mod and (i == imp or i.startswith(imp + ".")) for m, i in found), mod


def test_the_room_check_would_see_a_wrong_import():
    # run/ importing the model engine would be a wrong import under a rule forbidding engines
    assert wrong_way({"kvbench.run": ("kvbench.engines",)}) != []


def test_the_rooms_exist_with_a_docstring():
    for room in ("formats", "stores", "attention", "attention.gpu", "model"):
        mod = importlib.import_module(f"kvbench.kernels.{room}")
        assert mod.__doc__ and len(mod.__doc__) > 40, room
    assert importlib.import_module("kvbench.peers").__doc__
