"""A real model as mlx-lm builds it: from a GGUF file or an mlx-lm model directory.

The architecture is mlx-lm's (`mlx_lm.models.<model_type>`): kvbench writes no forward pass of
its own. kvbench's cache goes in through mlx-lm's cache protocol (kernels/model/cache.py) and its
attention kernels through mlx-lm's one attention function (kernels/model/seam.py).

* mlx-lm model directory (config.json + model*.safetensors, mlx-lm-quantized ones included):
  `mlx_lm.utils.load_model`, as `mlx_lm.load` does.
* GGUF file: the `gguf` package reads the file (every quant type llama.cpp writes, K-quants
  included) and dequantizes each tensor to float32; gguf's own name table
  (`gguf.get_tensor_name_map`, the one llama.cpp's converter writes with) maps each mlx-lm
  parameter name onto its GGUF tensor, and the config.json mlx-lm wants is rebuilt from the
  GGUF metadata (GGUF_CONFIG). Dense float32 weights: the CPU path runs plain matmuls, no
  quantized matmul (one token's products in row blocks: kernels/model/matvec.py; RoPE from a
  table: kernels/model/rope.py), and the
  float32 cache that quality is measured against is the model's own precision. llama.cpp's
  converter permutes the Q and K rows of `llama` models so that its interleaved RoPE (x[2i]
  with x[2i+1]) computes what Hugging Face's half-split RoPE computes;
  the loader undoes that (PERMUTED_ARCHS), so K/V are cached in the channel order mlx-lm and
  Hugging Face hold them (this matters for group-wise and per-channel key scales).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kvbench.kernels.model.matvec import use_blocked
from kvbench.kernels.model.rope import use_table

PERMUTED_ARCHS = ("llama",)  # archs whose GGUF Q/K rows llama.cpp permutes for its RoPE


def llamacpp_key_order(arch: str) -> str:
    """The key channel order llama.cpp's cache holds for an mlx-lm architecture: GGUF's
    interleaved one where its converter permuted the Q/K rows (llama: its RoPE pairs 2i with
    2i+1), else the model's own (Gemma, Qwen2: NEOX RoPE, the rows as Hugging Face has them)."""
    return "gguf" if arch in PERMUTED_ARCHS else "hf"


# GGUF architecture -> (mlx-lm model_type, extra config.json keys). Gemma 3: llama.cpp fixes
# what its GGUF does not store (src/llama-model.cpp): every 6th layer global, the others a
# sliding window with RoPE base 10000, queries scaled by 1/sqrt(key_length) for the sizes up to
# 12B; and its converter stores RMSNorm weights + 1 (Gemma's norm multiplies by 1 + w, as
# mlx-lm's gemma3_text does), so the loader subtracts NORM_SHIFT.
GGUF_ARCHS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "gemma3": ("gemma3_text", {"sliding_window_pattern": 6, "rope_local_base_freq": 10000.0}),
}
GGUF_ARCH_CONFIG = {"gemma3": {"sliding_window": "attention.sliding_window",
                               "query_pre_attn_scalar": "attention.key_length"}}  # fmt: skip
NORM_SHIFT = {"gemma3": 1.0}

# config.json key -> GGUF metadata key under "<arch>." (those every mapped arch has)
GGUF_CONFIG = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "max_position_embeddings": "context_length",
    "vocab_size": "vocab_size",
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads")


class ModelError(ValueError):
    """A model that cannot be loaded (the message is one line naming the file and the reason)."""


@dataclass(frozen=True)
class Shape:
    """What kvbench needs to know of a model's attention: per-layer K/V sizes, windows."""

    arch: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    trained_context: int | None  # max_position_embeddings / <arch>.context_length
    hidden: int = 0
    windows: tuple = ()  # per layer None or (window, sinks): kernels/model/cache.py layer_windows


@dataclass
class Model:
    net: nn.Module  # the mlx-lm Model: net(tokens [B, n], cache=[per-layer caches]) -> logits
    config: Shape
    hf_config: dict  # the config.json mlx-lm built the model from
    metadata: dict = field(default_factory=dict)  # GGUF metadata (tokenizer, chat template)
    path: str = ""


def shape_of(cfg: dict, net=None) -> Shape:
    """The Shape of a model: from config.json, and with `net`, the K/V each layer really
    stores (one token through mlx-lm's own caches: an architecture may ignore a config key,
    as mlx-lm's qwen2 ignores head_dim) and the window of each layer (its make_cache)."""
    text = cfg.get("text_config") or {}
    get = lambda k, d=None: cfg.get(k, text.get(k, d))  # noqa: E731
    n_heads = get("num_attention_heads")
    n_kv, head_dim = get("num_key_value_heads") or n_heads, get("head_dim")
    if net is not None:
        n_kv, head_dim = _kv_shape(net)
    return Shape(
        arch=cfg.get("model_type", "?"),
        n_layers=get("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim or get("hidden_size") // n_heads,
        vocab=get("vocab_size"),
        trained_context=get("max_position_embeddings"),
        hidden=get("hidden_size"),
        windows=() if net is None else _windows(net),
    )


def _kv_shape(net) -> tuple[int, int]:
    """(KV heads, head_dim) every layer stores, read from mlx-lm's caches after one token."""
    from mlx_lm.models.cache import make_prompt_cache

    caches = make_prompt_cache(net)
    net(mx.array([[0]]), cache=caches)
    shapes = {
        (c.keys.shape[1], c.keys.shape[3]) for c in caches if getattr(c, "keys", None) is not None
    }
    if len(shapes) != 1:
        kinds = sorted(shapes)
        raise ModelError(f"model {type(net).__module__}: layers store K/V of shapes {kinds}; "
                         "kvbench's caches take one for every layer")  # fmt: skip
    return shapes.pop()


def config_windows(path, cfg: dict) -> tuple:
    """Each layer's window (kernels/model/cache.py layer_windows) of the architecture `cfg`
    describes, built with lazy weights that are never evaluated (no memory, no file read);
    ModelError, one line, for an architecture mlx-lm lacks."""
    return _windows(_build(path, cfg))


def _windows(net) -> tuple:
    from kvbench.kernels.model.cache import layer_windows

    try:
        return layer_windows(net)
    except ValueError as e:
        raise ModelError(f"model {type(net).__module__}: {e}") from None


def _build(path, cfg: dict) -> nn.Module:
    from mlx_lm.utils import _get_classes

    try:
        model_class, args_class = _get_classes(cfg)
    except ValueError:
        raise ModelError(f"{path}: model_type {cfg.get('model_type')!r}: mlx-lm has no such "
                         "architecture") from None  # fmt: skip
    try:
        return model_class(args_class.from_dict(cfg))
    except (TypeError, KeyError, ValueError, AttributeError, AssertionError) as e:
        raise ModelError(f"{path}: config.json does not fit mlx-lm's {cfg['model_type']}: "
                         f"{type(e).__name__}: {e}") from None  # fmt: skip


# ---- mlx-lm directories ---------------------------------------------------------------------


def read_config(path: Path) -> dict:
    """An mlx-lm model directory's config.json, with a model_type and a shape that holds
    (check_config), or one clear ModelError naming the file and the key."""
    where = path / "config.json"
    check_regular(where)
    try:
        cfg = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON, not UTF-8
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"{where}: unreadable: {why[:200]}") from None
    if not isinstance(cfg, dict):
        kind = "null" if cfg is None else type(cfg).__name__
        raise ModelError(f"{where}: -: not a JSON object ({kind})")
    if not isinstance(cfg.get("model_type"), str):
        raise ModelError(f"{where}: model_type: missing or not text")
    check_config(cfg, lambda key: f"{where}: {key}")
    return cfg


# far above any published model (a few hundred layers, a few hundred heads); a config past them
# would have mlx-lm build a list of that many layers while its shape is read (a MemoryError)
SHAPE_LIMITS = {"num_hidden_layers": 10_000, "num_attention_heads": 100_000,
                "num_key_value_heads": 100_000}  # fmt: skip


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def check_config(cfg: dict, name) -> None:
    """The shape keys of a config (config.json's, or rebuilt from GGUF metadata) as data:
    layers, heads, hidden size positive integers; KV heads, head_dim, vocabulary positive
    integers where given, KV heads dividing the heads; rope_theta positive and finite.
    name(key) -> where the key lives ("<file>: <key>"), for a one-line ModelError (issue 35:
    null, text, a missing or zero head count gave tracebacks, head_dim 0 a listed case)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    get = lambda k: cfg.get(k, text.get(k))  # noqa: E731
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        if get(key) is None:
            raise ModelError(f"{name(key)}: missing")
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size", "num_key_value_heads",
                "head_dim", "vocab_size", "max_position_embeddings"):  # fmt: skip
        v = get(key)
        if v is not None and not _positive_int(v):
            raise ModelError(f"{name(key)}: must be a positive integer, got {v!r}")
    for key, limit in SHAPE_LIMITS.items():
        if get(key) is not None and get(key) > limit:
            why = "not a model kvbench can build (mlx-lm makes an object per layer)"
            raise ModelError(f"{name(key)}: {get(key):,} is more than {limit:,}: {why}")
    heads, kv = get("num_attention_heads"), get("num_key_value_heads")
    if kv is not None and heads % kv:
        raise ModelError(f"{name('num_key_value_heads')}: {kv} does not divide the "
                         f"{heads} attention heads")  # fmt: skip
    if get("head_dim") is None and get("hidden_size") // heads == 0:
        raise ModelError(f"{name('hidden_size')}: {get('hidden_size')} / {heads} heads gives "
                         "head_dim 0")  # fmt: skip
    theta = get("rope_theta")
    ok = isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0
    if theta is not None and not (ok and math.isfinite(theta)):
        raise ModelError(f"{name('rope_theta')}: must be a positive finite number, got {theta!r}")


def load_mlx_dir(path: str | Path) -> Model:
    """An mlx-lm model directory (or a Hugging Face snapshot of one)."""
    from mlx_lm.utils import load_model as mlx_load

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: a model directory needs config.json (none there)")
    if not list(path.glob("model*.safetensors")):
        raise ModelError(f"{path}: no model*.safetensors weights")
    cfg = read_config(path)
    _build(path, cfg)  # one clear line for an unknown architecture, before mlx-lm's own loader
    try:
        net, cfg = mlx_load(path)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise ModelError(f"{path}: mlx-lm cannot load it: {str(e).splitlines()[0]}") from None
    return Model(net, shape_of(cfg, net), cfg, {}, str(path))


# ---- GGUF -----------------------------------------------------------------------------------


def gguf_metadata(reader) -> dict:
    """Every metadata field of a GGUFReader as Python values (lists for arrays)."""
    out = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = f.contents()
        except (ValueError, IndexError, UnicodeDecodeError):
            continue
    return out


def gguf_config(md: dict, tensor_names, path) -> dict:
    """The config.json mlx-lm wants, from a GGUF's metadata."""
    arch = md.get("general.architecture")
    if arch not in GGUF_ARCHS:
        raise ModelError(f"{path}: GGUF architecture {arch!r}: kvbench maps "
                         f"{', '.join(GGUF_ARCHS)} onto mlx-lm") from None  # fmt: skip
    model_type, extra = GGUF_ARCHS[arch]
    cfg = {"model_type": model_type, **extra}
    for key, gkey in {**GGUF_CONFIG, **GGUF_ARCH_CONFIG.get(arch, {})}.items():
        if f"{arch}.{gkey}" in md:
            cfg[key] = md[f"{arch}.{gkey}"]
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise ModelError(f"{path}: GGUF metadata lacks {arch}.{GGUF_CONFIG[missing[0]]}")
    cfg.setdefault("vocab_size", len(md.get("tokenizer.ggml.tokens", [])) or None)
    names = {**GGUF_CONFIG, **GGUF_ARCH_CONFIG.get(arch, {})}
    check_config(cfg, lambda key: f"{path}: {arch}.{names[key]}" if key in names else
                 f"{path}: {key}")  # fmt: skip
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    cfg.setdefault("rms_norm_eps", 1e-5)
    cfg.setdefault("intermediate_size", 4 * cfg["hidden_size"])
    if f"{arch}.rope.scale_linear" in md:  # the older key
        cfg["rope_scaling"] = {"type": "linear", "factor": float(md[f"{arch}.rope.scale_linear"])}
    kind = str(md.get(f"{arch}.rope.scaling.type", "none"))  # gguf.Keys.Rope.SCALING_TYPE
    if kind == "linear":
        factor = float(md.get(f"{arch}.rope.scaling.factor", 1.0))
        cfg["rope_scaling"] = {"type": "linear", "factor": factor}
    elif kind != "none":  # yarn, longrope, ...: mapping them wrongly would give wrong logits
        raise ModelError(f"{path}: {arch}.rope.scaling.type {kind} is not mapped yet; "
                         "use the model's mlx-lm directory")  # fmt: skip
    if "rope_freqs.weight" in tensor_names:
        raise ModelError(f"{path}: rope_freqs (Llama 3.1 RoPE scaling) is not mapped yet; "
                         "use the model's mlx-lm directory")  # fmt: skip
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names
    return cfg


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: GGUF row h*D + 2j + s holds HF row h*D + s*D/2 + j."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor(t) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    if t.tensor_type in (Q.F32, Q.F16, Q.BF16):
        a = np.asarray(dequantize(t.data, t.tensor_type) if t.tensor_type == Q.BF16 else t.data)
    else:
        a = dequantize(t.data, t.tensor_type)
    return a.astype(np.float32).reshape([int(n) for n in reversed(t.shape)])


def load_gguf(path: str | Path) -> Model:
    """A GGUF file as an mlx-lm model with dequantized float32 weights (see module)."""
    import gguf
    from mlx.utils import tree_flatten

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError, struct_error()) as e:
        raise ModelError(f"{path}: not a readable GGUF file: {e}") from None
    md = gguf_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    cfg = gguf_config(md, tensors, path)
    net = _build(path, cfg)
    arch = md["general.architecture"]
    if (
        "head_dim" not in inspect.signature(type(net.args)).parameters
        and cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        * cfg["num_attention_heads"]
        != cfg["hidden_size"]
    ):
        raise ModelError(f"{path}: {arch}.attention.key_length {cfg['head_dim']} is not "
                         f"embedding_length / head_count, which mlx-lm's {cfg['model_type']} "
                         "assumes")  # fmt: skip
    names = gguf.get_tensor_name_map(
        {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch], cfg["num_hidden_layers"]
    )
    weights = {}
    for name, _ in tree_flatten(net.parameters()):
        src = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if src not in tensors:
            if name == "lm_head.weight" and cfg["tie_word_embeddings"]:
                continue
            raise ModelError(f"{path}: no GGUF tensor for {name} (looked for {src})")
        a = _tensor(tensors[src])
        if arch in PERMUTED_ARCHS and src.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg["num_attention_heads"] if "attn_q" in src else cfg["num_key_value_heads"]
            a = unpermute(a, heads)
        if arch in NORM_SHIFT and src.endswith("norm.weight"):
            a = a - NORM_SHIFT[arch]
        weights[name] = mx.array(a)
    if hasattr(net, "sanitize"):
        weights = net.sanitize(weights)
    net.load_weights(list(weights.items()), strict=True)
    mx.eval(net.parameters())
    return Model(net, shape_of(cfg, net), cfg, md, str(path))


NOT_REGULAR = {stat.S_ISFIFO: "a named pipe", stat.S_ISCHR: "a device", stat.S_ISBLK: "a device",
               stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory"}  # fmt: skip
MODEL_FILES = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt")


def check_regular(path: Path) -> None:
    """ModelError naming path when it is not a regular file: opening a named pipe blocks for
    ever, a device never ends (issue 35: `model: pipe.gguf` hung plan and run)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        why = next((k for test, k in NOT_REGULAR.items() if test(mode)), "not a regular file")
        raise ModelError(f"{path}: {why}, not a model file")


def check_model_path(path: Path) -> None:
    """A GGUF file, or a directory whose files kvbench or mlx-lm read, all regular files."""
    if not path.is_dir():
        return check_regular(path)
    for pattern in MODEL_FILES:
        for f in sorted(path.glob(pattern)):
            check_regular(f)


def struct_error():
    import struct

    return struct.error


def load_model(path: str | Path) -> Model:
    """A GGUF file or an mlx-lm model directory (ModelError, one line, for anything else)."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such file or directory")
    check_model_path(path)
    if path.suffix != ".gguf" and not path.is_dir():
        raise ModelError(f"{path}: not a .gguf file or a model directory")
    model = load_mlx_dir(path) if path.is_dir() else load_gguf(path)
    use_blocked(model.net)  # one token's weight products on the CPU (kernels/model/matvec.py)
    use_table(model.net)  # RoPE's cos and sin from a table on the CPU (kernels/model/rope.py)
    return model
