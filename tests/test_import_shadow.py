"""The repository's kernels/ folder never imports as the top-level `kernels` (issue 51).

PyPI's `kernels` (Hugging Face's, a dependency of transformers >= 5.25) is imported by
transformers when torch is present; a process started at the repository root (python -m
pytest, python -m kvbench, a worker subprocess) must reach that package or none, never
kernels/, whose import name is kvbench.kernels.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = (ROOT / "kernels" / "__init__.py").resolve()


def _python_at_root(code: str) -> subprocess.CompletedProcess:
    """`python -c CODE` with the working directory at the root: sys.path[0] is the root."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_importing_kvbench_first_takes_the_root_off_sys_path():
    code = (
        "import importlib.util, kvbench, sys\n"
        "spec = importlib.util.find_spec('kernels')\n"
        "print(spec.origin if spec else 'none')\n"
    )
    done = _python_at_root(code)
    assert done.returncode == 0, done.stderr
    found = done.stdout.strip().splitlines()[-1]
    assert found == "none" or Path(found).resolve() != OURS, found


def test_the_folder_imported_as_top_level_kernels_fails_naming_the_cause():
    done = _python_at_root("import kernels")  # sys.path[0] is the root: the folder is found
    assert done.returncode != 0
    assert "kvbench.kernels" in done.stderr and "PYTHONSAFEPATH" in done.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
    reason="transformers and torch (make peers) are what import PyPI's kernels",
)
def test_transformers_hub_kernels_import_from_the_root_with_torch_present():
    """The four model tests of issue 51 failed here: transformers reached kernels/ by name."""
    code = (
        "import kvbench\n"
        "from transformers.utils import is_kernels_available\n"
        "import transformers.integrations.hub_kernels as hk\n"
        "print(is_kernels_available())\n"
    )
    done = _python_at_root(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CUDAProperties" not in done.stderr
