"""The installed distribution claims only the import name `kvbench`.

PyPI's popular `kernels` package (compute kernels from the Hugging Face Hub) installs a
top-level `kernels`; if kvbench installed its kernels/ folder under that name too, pip would
silently overwrite one with the other. A fresh venv gets PyPI's `kernels` first, then kvbench
(a regular, non-editable install); both must import as themselves and `kvbench run` must work.
kvbench's own dependencies (mlx, pandas, ...) are borrowed from the test environment through a
.pth line, so the test downloads only `kernels` and its dependencies (pip's cache keeps them).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pip(venv_python: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--python", str(venv_python), "install", "-q", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_kvbench_installs_beside_pypi_kernels(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    got = pip(py, "kernels")
    if got.returncode:
        pytest.skip(f"PyPI's kernels package could not be installed here: {got.stderr[-300:]}")
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # kvbench's dependencies from this environment, after the venv's own packages
    Path(purelib, "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # from a copy: an in-tree build would leave build/ (a stale second copy) in the checkout
    src = tmp_path / "src"
    for name in ("harness", "kernels"):
        shutil.copytree(ROOT / name, src / name)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    got = pip(py, "--no-deps", str(src))
    assert got.returncode == 0, got.stderr[-2000:]
    check = (
        "import kernels, kvbench, kvbench.kernels.formats.registry as f, sys; "
        f"assert kernels.__file__.startswith({purelib!r}), kernels.__file__; "
        "assert hasattr(kernels, 'get_kernel'), 'not PyPI kernels'; "
        "assert 'kvbench/kernels/formats/registry.py' in f.__file__, f.__file__; "
        f"assert f.__file__.startswith({purelib!r}), f.__file__"
    )
    subprocess.run([py, "-c", check], check=True, cwd=tmp_path)
    out = tmp_path / "out"
    run = [venv / "bin" / "kvbench", "run", str(ROOT / "suites" / "smoke.yaml"), "--out", str(out)]
    run += ["--filter", "kernel=ops", "--filter", "context_len=64"]
    env = {**os.environ, "PYTHONNOUSERSITE": "1"}
    r = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(p.suffix == ".csv" for p in out.iterdir())


def _setuptools_config() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _importable_folders() -> dict[str, Path]:
    """Every folder setuptools' build_py takes for a package: an identifier name holding files
    (with or without __init__.py; the GPU sources' folders hold only .metal/.cu/.h/.inc)."""
    found = {}
    for folder, name in ((ROOT / "harness", "kvbench"), (ROOT / "kernels", "kvbench.kernels")):
        for d in [folder, *folder.rglob("*")]:
            rel = d.relative_to(folder).parts
            if not d.is_dir() or "__pycache__" in rel or not all(p.isidentifier() for p in rel):
                continue
            if any(f.is_file() for f in d.iterdir()):
                found[".".join((name, *rel))] = d
    return found


def test_every_package_folder_is_in_pyprojects_package_list():
    """A regular install ships only the packages pyproject lists: a new package folder left out
    of the list imports from the source tree and breaks once installed, and a data folder left
    out makes setuptools print a 30-line warning per folder on every install (#44 item 4)."""
    assert set(_importable_folders()) == set(_setuptools_config()["packages"])


def test_package_data_globs_cover_every_non_python_file():
    """Every file a package folder holds other than .py ships: the GPU sources are read at run
    time from beside kernels.py, so one left out breaks the GPU kernels of an installed copy."""
    data = _setuptools_config()["package-data"]
    for name, d in _importable_folders().items():
        for f in d.iterdir():
            if f.is_file() and f.suffix not in (".py", ".pyc"):
                assert any(f.match(g) for g in data.get(name, [])), (name, f.name)


def test_every_install_of_the_makefile_is_held_to_the_lock():
    """make install / peers / gates-deps / llamacpp install what the last green CI ran (issue 51):
    each pip install outside `make lock` takes constraints/kvbench.txt, which pins every package
    of the environment (the ones pyproject names and transformers, which brought PyPI's kernels)."""
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\nlock:", 1)[0]  # `make lock` alone resolves afresh
    installs = [ln for ln in recipe.replace("\\\n", " ").splitlines() if "pip install" in ln]
    assert len(installs) >= 6 and all("-c $(LOCK)" in ln for ln in installs), installs
    pins = dict(
        ln.split("==", 1)
        for ln in (ROOT / "constraints" / "kvbench.txt").read_text().splitlines()
        if "==" in ln
    )
    for name in ("mlx", "mlx-lm", "numpy", "pandas", "transformers", "kernels", "torch", "pip"):
        assert name in pins, name
