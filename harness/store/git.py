"""The one git wrapper: every git call of kvbench goes through here, with one meaning of dirty.

Dirty = the working tree differs from HEAD in what a run could measure: a tracked file is
modified, staged or deleted, or an untracked file that git does not ignore exists (new source
may be imported by the run). The run context stamps rows with it and the gate uses the same
test to decide whether a clean run of HEAD can exist, so the two never disagree.

Git refuses repositories owned by another user ("dubious ownership", common in CI
containers); kvbench only reads its own checkout, so every call names the repository as a safe
directory on the command line (a protected scope that git honours) instead of failing with an
empty commit. This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvbench.errors import UserError

TIMEOUT_S = 30


def _run(repo: str | Path, *args: str) -> subprocess.CompletedProcess | None:
    repo = str(Path(repo).resolve())
    cmd = ["git", "-c", f"safe.directory={repo}", "-C", repo, *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def query(repo: str | Path, *args: str) -> str | None:
    """git's stdout, stripped; None when git is missing, fails or times out."""
    out = _run(repo, *args)
    return out.stdout.strip() if out is not None and out.returncode == 0 else None


def must(repo: str | Path, *args: str) -> str:
    """git's stdout, stripped; a UserError with git's last message line when it fails."""
    out = _run(repo, *args)
    if out is None or out.returncode:
        why = out.stderr.strip().splitlines()[-1:] if out is not None else ["git not runnable"]
        raise UserError(f"git {' '.join(args)}: {' '.join(why) or 'failed'}")
    return out.stdout.strip()


def toplevel(path: str | Path = ".") -> Path | None:
    top = query(path, "rev-parse", "--show-toplevel")
    return Path(top) if top else None


def is_dirty(repo: str | Path) -> bool | None:
    """Tracked changes or untracked, non-ignored files (module docstring); None without git."""
    status = query(repo, "status", "--porcelain", "--untracked-files=normal")
    return bool(status) if status is not None else None


def resolve_ref(ref: str, repo: str | Path = ".") -> str | None:
    """The full sha `ref` names in the repository at `repo`, or None."""
    return query(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}") or None


def info(repo: str | Path) -> dict:
    """commit (12 characters), dirty and branch of the checkout at `repo` (None without git)."""
    commit = query(repo, "rev-parse", "HEAD")
    return {
        "commit": commit[:12] if commit else None,
        "dirty": is_dirty(repo) if commit else None,
        "branch": query(repo, "rev-parse", "--abbrev-ref", "HEAD"),
    }


def topo_order(repo: str | Path = ".") -> list[str]:
    """Every commit of the repository, oldest first in topological order (empty without git)."""
    out = query(repo, "rev-list", "--topo-order", "--reverse", "--all")
    return out.split() if out else []


@contextmanager
def worktree(repo: str | Path, sha: str, where: Path) -> Iterator[Path]:
    """`sha` checked out (detached) at `where` for the duration; removed afterwards."""
    must(repo, "worktree", "add", "--detach", str(where), sha)
    try:
        yield where
    finally:
        must(repo, "worktree", "remove", "--force", str(where))
