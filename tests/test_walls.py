"""The walls of the design (docs/architecture.md), proven by walking the packages:

* the floors: every room of harness/ and kernels/ stands on a floor, in a column (FLOORS); a
  module imports only its own room and rooms on lower floors of the columns its column may
  reach (REACH), read statically from every module's import statements; each import that
  still runs against the floors is listed with its reason (EXCEPTIONS); a scratch copy of the
  tree with an upward import planted in every room shows that each is caught;
* store/, analysis/ and report/ (and the root modules they use) import neither mlx nor
  kernels/ nor suite/, engines/ or run/: results are compared and plotted from files alone;
* kernels/ never imports the instrument (any `kvbench.*` module outside kvbench.kernels);
* `kvbench compare/history/report/import` run in a process where importing mlx raises.
The last three import each module in a fresh interpreter and record every module the import
pulls in, so an indirect import through a helper module is caught too.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import kvbench
import kvbench.kernels

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns("__pycache__", "*.metal", "*.cu", "*.h", "*.inc")
FILES_ONLY = ("kvbench.store", "kvbench.analysis", "kvbench.report")
FORBIDDEN_FOR_FILES_ONLY = (
    "mlx", "kvbench.kernels", "kvbench.suite", "kvbench.engines", "kvbench.run",
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
    for pkg in ("suite", "engines", "run", "store", "analysis", "report", "kernels"):
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


# ---- the floors (static: each module's own import statements, read from its source) --------
# Every room of the tree stands on a floor and in a column. A module may import its own room,
# and a room on a LOWER floor in a column its column may import; nothing on its own floor or
# above. So each room can be read, tested and changed knowing only the rooms below it.
#   package:  the kvbench package itself (version, schema version) and the BLAS it loads first
#   kernels:  what is measured; imports nothing of the instrument
#   base:     the instrument's root modules and the result files' schema (no mlx)
#   measure:  what runs a case: may import kernels/
#   reading:  what reads result files alone (no mlx, no kernels/, nothing of measure)
#   top:      the command line, over everything
FLOORS = {
    # room: (floor, column)
    "kvbench.blas": (0, "package"),
    "kvbench": (1, "package"),
    "kvbench.kernels": (0, "kernels"),
    "kvbench.kernels.formats": (0, "kernels"),
    "kvbench.kernels.stores": (1, "kernels"),
    "kvbench.kernels.attention.gpu": (1, "kernels"),
    "kvbench.kernels.attention": (2, "kernels"),
    "kvbench.kernels.model": (3, "kernels"),
    "kvbench.kernels.data": (4, "kernels"),
    "kvbench.errors": (1, "base"),
    "kvbench.axes": (1, "base"),
    "kvbench.stats": (1, "base"),
    "kvbench.files": (2, "base"),
    "kvbench.case": (2, "base"),
    "kvbench.store": (5, "base"),
    "kvbench.timer": (3, "measure"),
    "kvbench.peers": (3, "measure"),
    "kvbench.suite": (5, "measure"),
    "kvbench.engines": (6, "measure"),
    "kvbench.run": (7, "measure"),
    "kvbench.analysis": (6, "reading"),
    "kvbench.report": (7, "reading"),
    "kvbench.cli": (8, "top"),
    "kvbench.__main__": (9, "top"),
}  # fmt: skip
# column -> the columns its rooms may import (below their floor)
REACH = {
    "package": {"package"},
    "kernels": {"kernels"},
    "base": {"package", "base"},
    "measure": {"package", "base", "kernels", "measure"},
    "reading": {"package", "base", "reading"},
    "top": {"package", "base", "kernels", "measure", "reading", "top"},
}
# imports that run against the floors, each with its reason (importer module, imported prefix)
EXCEPTIONS = {
    ("kvbench.kernels.stores.paged", "kvbench.kernels.attention.tiled"):
        "page_read: table folds each page into the tiled kernel's running state (fold_tile), "
        "the same code the tiled kernel runs, rather than a copy of it",
}  # fmt: skip


def room_of(name: str) -> str | None:
    """The room a module (or a name imported from one) belongs to: the longest FLOORS key it
    lies under."""
    found = [r for r in FLOORS if name == r or name.startswith(r + ".")]
    return max(found, key=len) if found else None


def allowed(importer: str, imported: str) -> bool:
    a, b = room_of(importer), room_of(imported)
    if a == b:
        return True
    (fa, ca), (fb, cb) = FLOORS[a], FLOORS[b]
    return fb < fa and cb in REACH[ca]


def module_file(name: str, root: Path = ROOT) -> Path:
    parts = name.split(".")
    base = root / "kernels" if parts[:2] == ["kvbench", "kernels"] else root / "harness"
    rest = parts[2:] if parts[:2] == ["kvbench", "kernels"] else parts[1:]
    path = base.joinpath(*rest)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports_of(name: str, root: Path = ROOT) -> set[str]:
    """Modules named by the import statements of one module (absolute; kvbench has no
    relative imports)."""
    import ast

    tree = ast.parse(module_file(name, root).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def every_module() -> list[str]:
    return modules_of(kvbench) + modules_of(kvbench.kernels)


def against_the_floors(root: Path = ROOT) -> list[tuple[str, str]]:
    """Every (module, import) of the tree at `root` that the floors do not allow."""
    bad = []
    for mod in every_module():
        for imp in imports_of(mod, root):
            if imp.startswith("kvbench") and room_of(imp) and not allowed(mod, imp):
                bad.append((mod, imp))
    return sorted(bad)


def _excused(mod: str, imp: str) -> bool:
    return any(mod == m and (imp == i or imp.startswith(i + ".")) for m, i in EXCEPTIONS)


def test_every_module_stands_on_a_floor():
    # a new package or root module must be given its floor here, or this fails
    assert [m for m in every_module() if room_of(m) is None] == []
    assert set(FLOORS) <= {room_of(m) for m in every_module()} | {"kvbench.__main__"}


def test_no_module_imports_against_the_floors():
    assert [b for b in against_the_floors() if not _excused(*b)] == []


def test_every_listed_exception_still_exists():
    # an exception whose import is gone must leave the list, so the list stays the truth
    found = against_the_floors()
    for mod, imp in EXCEPTIONS:
        assert any(m == mod and (i == imp or i.startswith(imp + ".")) for m, i in found), mod


def test_the_floors_keep_the_design_walls():
    # the walls docs/architecture.md states, as consequences of the table
    harness = [r for r, (_, c) in FLOORS.items() if c not in ("package", "kernels")]
    for room in (r for r, (_, c) in FLOORS.items() if c == "kernels"):
        assert not any(allowed(room + ".x", h + ".x") for h in harness), room
    for reader in ("kvbench.store", "kvbench.analysis", "kvbench.report"):
        for room in ("kvbench.kernels.formats", "kvbench.suite", "kvbench.engines", "kvbench.run",
                     "kvbench.timer", "kvbench.peers"):  # fmt: skip
            assert not allowed(reader + ".x", room + ".x"), (reader, room)
    for upper, lower in (("kvbench.run", "kvbench.analysis"), ("kvbench.suite", "kvbench.store"),
                         ("kvbench.engines", "kvbench.run"), ("kvbench.suite", "kvbench.engines"),
                         ("kvbench.kernels.formats", "kvbench.kernels.stores"),
                         ("kvbench.kernels.stores", "kvbench.kernels.model")):  # fmt: skip
        assert not allowed(upper + ".x", lower + ".x"), (upper, lower)


def test_the_architecture_doc_shows_the_floors():
    """docs/architecture.md's floor table is FLOORS, cell by cell."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    lines = text[text.index("| floor | package |") :].splitlines()
    columns = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    shown = {}
    for line in lines[2:]:
        if not line.strip().startswith("|"):
            break
        floor, *cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for column, cell in zip(columns, cells):
            for name in filter(None, (n.strip() for n in cell.split(","))):
                name = name.replace("`", "").replace(" (package)", "").rstrip("/")
                name = name.removesuffix(".py").replace("/", ".")
                prefix = "kvbench.kernels." if column == "kernels" else "kvbench."
                room = name if name.startswith("kvbench") else prefix + name
                shown[room] = (int(floor), column)
    assert shown == FLOORS


def _planted(room: str) -> list[str]:
    """Rooms an import from `room` must never reach: the nearest room above it in its own
    column and in any column, and one room of each column it may not import."""
    floor, column = FLOORS[room]
    above = sorted((f, c != column, r) for r, (f, c) in FLOORS.items() if f > floor)
    targets = list(dict.fromkeys(r for _, _, r in above[:1] + [a for a in above if not a[1]][:1]))
    for r, (_, c) in FLOORS.items():
        if c not in REACH[column] and c not in {FLOORS[t][1] for t in targets}:
            targets.append(r)
    return targets


def test_a_planted_upward_import_is_caught_in_every_room(tmp_path):
    """A scratch copy of the tree with, in every room, imports of rooms it must not reach
    (the three the issue found the old pair list missed among them): each is reported."""
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=IGNORE)
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=IGNORE)
    planted = {}
    for room in FLOORS:
        if room == "kvbench.__main__":
            continue  # the top floor: nothing is above it
        host = next(m for m in every_module() if room_of(m) == room)
        planted[room] = (host, _planted(room))
    planted["kvbench.engines"][1].append("kvbench.run.session")
    planted["kvbench.kernels.attention"][1].append("kvbench.kernels.model.cache")
    planted["kvbench.analysis"][1].append("kvbench.report.page")
    for host, targets in planted.values():
        with module_file(host, tmp_path).open("a") as f:
            f.write("".join(f"\nimport {t}  # planted\n" for t in targets))
    found = set(against_the_floors(tmp_path))
    missed = [(h, t) for h, ts in planted.values() for t in ts if (h, t) not in found]
    assert missed == []
    assert len(planted) == len(FLOORS) - 1 and all(ts for _, ts in planted.values())


# Inside the model room, the modules stand on floors in the order data flows (docs/architecture.md):
# the model file, the text and what a cache holds; the caches and the seam; the model; running
# it; what reads it; capture. The same rule: a module imports only modules on lower floors. A
# package (policies/) is one member: its modules import each other and what stands below it.
MODEL_FLOORS = {
    "fetch": 0, "text": 0, "tokenizer": 0, "spec": 0, "protocol": 0, "meter": 0, "matvec": 0,
    "rope": 0,
    "policies": 1,
    "stream": 2,
    "cache": 3, "seam": 3,
    "load": 4, "evicting": 4, "batched": 4,
    "run": 5, "source": 5, "serve": 5,
    "quality": 6, "retrieval": 6, "generate": 6, "parts": 6,
    "capture": 7, "passkey": 7, "compress": 7, "shift": 7,
    "shift_quality": 8,
}  # fmt: skip
MODEL = "kvbench.kernels.model"


def against_the_model_floors(root: Path = ROOT) -> list[tuple[str, str]]:
    bad = []
    for mod in modules_of(importlib.import_module(MODEL))[1:]:
        member = mod[len(MODEL) + 1 :].split(".")[0]
        here = MODEL_FLOORS[member]
        for imp in imports_of(mod, root):
            if not imp.startswith(MODEL + "."):
                continue
            name = imp[len(MODEL) + 1 :].split(".")[0]
            if name in MODEL_FLOORS and MODEL_FLOORS[name] >= here and name != member:
                bad.append((mod, imp))
    return sorted(bad)


def test_every_model_module_stands_on_a_floor():
    names = {
        m[len(MODEL) + 1 :].split(".")[0] for m in modules_of(importlib.import_module(MODEL))[1:]
    }
    assert names == set(MODEL_FLOORS)


def test_the_model_room_imports_in_the_order_data_flows():
    assert against_the_model_floors() == []


def test_a_planted_upward_import_is_caught_in_every_model_module(tmp_path):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=IGNORE)
    (tmp_path / "harness").mkdir()
    top = max(MODEL_FLOORS.values())
    planted = []
    for name, floor in MODEL_FLOORS.items():
        if floor == top:
            continue  # nothing stands above the top floor
        up = min(f for f in MODEL_FLOORS.values() if f > floor)  # the nearest floor above
        target = next(n for n, f in MODEL_FLOORS.items() if f == up)
        host = f"{MODEL}.{name}"
        with module_file(host, tmp_path).open("a") as f:
            f.write(f"\nfrom {MODEL}.{target} import x  # planted\n")
        planted.append((host, f"{MODEL}.{target}"))
    found = set(against_the_model_floors(tmp_path))
    assert [p for p in planted if p not in found] == []
    assert len(planted) == sum(f < top for f in MODEL_FLOORS.values())


def test_the_rooms_exist_with_a_docstring():
    for room in ("formats", "stores", "attention", "attention.gpu", "model"):
        mod = importlib.import_module(f"kvbench.kernels.{room}")
        assert mod.__doc__ and len(mod.__doc__) > 40, room
    assert importlib.import_module("kvbench.peers").__doc__


# Inside engines/, no engine imports another (#41): what two engines share stands on a lower
# floor (contract, metrics, parity, model_step; then common, residency; then edit_rows), the
# engines above it, the registry on top. The same rule as the model room: a module imports
# only lower floors.
ENGINE_FLOORS = {
    "contract": 0, "metrics": 0, "parity": 0, "model_step": 0,
    "common": 1, "residency": 1,
    "edit_rows": 2, "serve_rows": 2,
    "cache": 3, "streams": 3, "paged": 3, "window": 3, "edits": 3, "peers": 3, "model": 3,
    "model_tasks": 3, "llamacpp": 3, "sharded": 3, "sharded_rank": 3, "serve": 3,
}  # fmt: skip
ENGINES = "kvbench.engines"


def against_the_engine_floors(root: Path = ROOT) -> list[tuple[str, str]]:
    bad = []
    for mod in modules_of(importlib.import_module(ENGINES))[1:]:
        here = ENGINE_FLOORS[mod.rsplit(".", 1)[1]]
        for imp in imports_of(mod, root):
            name = imp[len(ENGINES) + 1 :].split(".")[0] if imp.startswith(ENGINES + ".") else ""
            if name in ENGINE_FLOORS and ENGINE_FLOORS[name] >= here and imp != mod:
                bad.append((mod, imp))
    return sorted(bad)


def test_every_engine_module_stands_on_a_floor():
    names = {m.rsplit(".", 1)[1] for m in modules_of(importlib.import_module(ENGINES))[1:]}
    assert names == set(ENGINE_FLOORS)


def test_no_engine_imports_another_engine():
    assert against_the_engine_floors() == []


def test_a_planted_engine_to_engine_import_is_caught(tmp_path):
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=IGNORE)
    engines = [n for n, f in ENGINE_FLOORS.items() if f == max(ENGINE_FLOORS.values())]
    planted = []
    for i, name in enumerate(engines):  # each engine imports the next one (both forms)
        other = engines[(i + 1) % len(engines)]
        line = f"from {ENGINES} import {other}" if i % 2 else f"from {ENGINES}.{other} import x"
        with module_file(f"{ENGINES}.{name}", tmp_path).open("a") as f:
            f.write(f"\n{line}  # planted\n")
        planted.append(f"{ENGINES}.{name}")
    assert sorted({m for m, _ in against_the_engine_floors(tmp_path)}) == sorted(planted)
