"""A Llama-family forward pass in plain MLX (SmolLM2, Llama 2/3, Mistral, Qwen2 with QKV biases).

Weights come from a GGUF file (`mx.load(path, return_metadata=True)`: F32/F16 tensors stay
dense, Q4_0/Q4_1/Q8_0 come back as MLX affine-quantized weight/scales/biases and run through
mx.quantized_matmul) or from an mlx-lm model directory (config.json + *.safetensors, dense or
mlx-lm-quantized). Activations are float32: on MLX's CPU backend float32 quantized matmuls are
the fast path, and the float32 cache that quality is measured against then is the model's own
precision.

RoPE convention: Hugging Face checkpoints rotate the two halves of each head (x[i] with
x[i + D/2], mx.fast.rope traditional=False). llama.cpp's converter permutes the Q and K rows of
Llama-architecture models so that its interleaved RoPE (x[2i] with x[2i+1]) computes the same
thing; the loader undoes that permutation, so K/V are cached in the same channel order as
mlx-lm and Hugging Face hold them (this matters for group-wise and per-channel key scales).
Qwen2's GGUF is not permuted (llama.cpp uses NeoX RoPE for it).

Attention never happens here: every layer hands its post-RoPE q, k, v to the cache object
(kernels/model/cache.py), which stores K/V in its format (quantize on write) and runs a kvbench
attention kernel over what it stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

GGUF_GROUP = 32  # llama.cpp's Q4_0 / Q4_1 / Q8_0 blocks hold 32 weights
PERMUTED_ARCHS = ("llama",)  # archs whose GGUF Q/K rows llama.cpp permutes for its RoPE


@dataclass(frozen=True)
class Config:
    arch: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rope_base: float
    norm_eps: float
    rope_scale: float = 1.0  # positions are multiplied by this (linear RoPE scaling)
    # False: rotate half-split pairs (HF, the rows as loaded). True (interleaved pairs) is only
    # right for rows still in llama.cpp's order; tests use it as the wrong convention.
    rope_traditional: bool = False


@dataclass
class Model:
    config: Config
    params: dict  # "embed", "norm", "lm_head", each a Linear dict; "layers": list of dicts
    rope_freqs: mx.array | None = None  # per-pair wavelengths (Llama 3 rope_freqs), or None
    metadata: dict = field(default_factory=dict)  # the GGUF metadata or config.json


# ---- linear layers: a dict {"weight", ["scales", "biases", "group_size", "bits"], ["bias"]} ----


def linear(p: dict, x: mx.array) -> mx.array:
    if "scales" in p:
        y = mx.quantized_matmul(
            x, p["weight"], p["scales"], p.get("biases"), transpose=True,
            group_size=p["group_size"], bits=p["bits"],
        )  # fmt: skip
    else:
        y = x @ p["weight"].T
    return y + p["bias"] if "bias" in p else y


def embed(p: dict, tokens: mx.array) -> mx.array:
    """Rows of the (possibly quantized) embedding table, float32."""
    if "scales" not in p:
        return p["weight"][tokens].astype(mx.float32)
    w, s, b = (p[n][tokens] for n in ("weight", "scales", "biases"))
    return mx.dequantize(w, s, b, group_size=p["group_size"], bits=p["bits"]).astype(mx.float32)


def make_linear(arrays: dict, prefix: str, group_size: int | None) -> dict:
    """The Linear dict of `prefix` from flat arrays (`.weight`, `.scales`, `.biases`, `.bias`)."""
    p = {"weight": arrays[f"{prefix}.weight"]}
    if f"{prefix}.scales" in arrays:
        p["scales"] = arrays[f"{prefix}.scales"]
        p["biases"] = arrays.get(f"{prefix}.biases")
        gs = group_size or GGUF_GROUP
        # packed uint32 columns * 32 bits = in_features * bits, in_features = groups * gs
        bits = 32 * p["weight"].shape[1] // (p["scales"].shape[1] * gs)
        p.update(group_size=gs, bits=bits)
    elif p["weight"].dtype != mx.float32:
        p["weight"] = p["weight"].astype(mx.float32)
    if f"{prefix}.bias" in arrays:
        p["bias"] = arrays[f"{prefix}.bias"].astype(mx.float32)
    return p


def unpermute_rows(p: dict, n_heads: int) -> dict:
    """Undo llama.cpp's Q/K row permutation: GGUF row h*D + 2j + s holds HF row h*D + s*D/2 + j.

    Quantized weights are permuted whole rows (scales and biases with them), so the quantized
    values are untouched."""
    rows = p["weight"].shape[0]
    d = rows // n_heads
    order = [h * d + 2 * j + s for h in range(n_heads) for s in (0, 1) for j in range(d // 2)]
    idx = mx.array(order)
    out = dict(p)
    for name in ("weight", "scales", "biases", "bias"):
        if out.get(name) is not None:
            out[name] = out[name][idx]
    return out


# ---- loading -------------------------------------------------------------------------------

GGUF_LAYER = {  # our name -> GGUF tensor prefix inside blk.{i}
    "attn_norm": "attn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
    "o": "attn_output", "ffn_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up",
    "down": "ffn_down",
}  # fmt: skip
HF_LAYER = {  # our name -> mlx-lm / Hugging Face prefix inside model.layers.{i}
    "attn_norm": "input_layernorm", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
    "v": "self_attn.v_proj", "o": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
}  # fmt: skip


def _meta(md: dict, key: str, default=None):
    v = md.get(key, default)
    if v is None:
        raise ValueError(f"GGUF metadata has no {key!r}")
    return v.item() if isinstance(v, mx.array) else v


def gguf_config(md: dict) -> Config:
    arch = _meta(md, "general.architecture")
    a = lambda k, d=None: _meta(md, f"{arch}.{k}", d)  # noqa: E731
    hidden, n_heads = int(a("embedding_length")), int(a("attention.head_count"))
    return Config(
        arch=arch, n_layers=int(a("block_count")), hidden=hidden, n_heads=n_heads,
        n_kv_heads=int(a("attention.head_count_kv", n_heads)),
        head_dim=int(a("attention.key_length", hidden // n_heads)),
        vocab=int(a("vocab_size", len(md.get("tokenizer.ggml.tokens", [])) or None)),
        rope_base=float(a("rope.freq_base", 10000.0)),
        norm_eps=float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_scale=1.0 / float(a("rope.scale_linear", 1.0)),
    )  # fmt: skip


def _build(cfg: Config, arrays: dict, names: dict, layer_fmt: str, gs, permute: bool) -> dict:
    layers = []
    for i in range(cfg.n_layers):
        lp = {n: make_linear(arrays, layer_fmt.format(i=i, n=t), gs) for n, t in names.items()}
        if permute:
            lp["q"] = unpermute_rows(lp["q"], cfg.n_heads)
            lp["k"] = unpermute_rows(lp["k"], cfg.n_kv_heads)
        for n in ("attn_norm", "ffn_norm"):
            lp[n] = lp[n]["weight"]
        layers.append(lp)
    return {"layers": layers}


def load_gguf(path: str | Path) -> Model:
    arrays, md = mx.load(str(path), return_metadata=True)
    cfg = gguf_config(md)
    params = _build(cfg, arrays, GGUF_LAYER, "blk.{i}.{n}", None, cfg.arch in PERMUTED_ARCHS)
    params["embed"] = make_linear(arrays, "token_embd", None)
    params["norm"] = arrays["output_norm.weight"].astype(mx.float32)
    tied = "output.weight" not in arrays
    params["lm_head"] = params["embed"] if tied else make_linear(arrays, "output", None)
    freqs = None
    if "rope_freqs.weight" in arrays:  # Llama 3.1: theta_i / factor_i (llama.cpp's rope_freqs)
        freqs = _wavelengths(cfg) * arrays["rope_freqs.weight"].astype(mx.float32)
    mx.eval(params, freqs)  # the row un-permutation and casts run once, not every forward
    return Model(cfg, params, freqs, md)


def _wavelengths(cfg: Config) -> mx.array:
    return cfg.rope_base ** (mx.arange(0, cfg.head_dim, 2, dtype=mx.float32) / cfg.head_dim)


def hf_config(c: dict) -> Config:
    scaling = c.get("rope_scaling") or {}
    kind = scaling.get("type", scaling.get("rope_type", "linear"))
    if scaling and kind != "linear":
        raise ValueError(f"config.json: rope_scaling type {kind!r} is not supported (linear only)")
    n_heads = c["num_attention_heads"]
    return Config(
        arch=c.get("model_type", "llama"), n_layers=c["num_hidden_layers"],
        hidden=c["hidden_size"], n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads", n_heads),
        head_dim=c.get("head_dim") or c["hidden_size"] // n_heads, vocab=c["vocab_size"],
        rope_base=float(c.get("rope_theta", 10000.0)), norm_eps=float(c["rms_norm_eps"]),
        rope_scale=1.0 / float(scaling.get("factor", 1.0)),
    )  # fmt: skip


def load_mlx_dir(path: str | Path) -> Model:
    """An mlx-lm model directory: config.json and model*.safetensors (HF names, HF RoPE order)."""
    path = Path(path)
    c = json.loads((path / "config.json").read_text())
    cfg = hf_config(c)
    arrays = {}
    for f in sorted(path.glob("*.safetensors")):
        arrays.update(mx.load(str(f)))
    gs = (c.get("quantization") or {}).get("group_size")
    params = _build(cfg, arrays, HF_LAYER, "model.layers.{i}.{n}", gs, False)
    params["embed"] = make_linear(arrays, "model.embed_tokens", gs)
    params["norm"] = arrays["model.norm.weight"].astype(mx.float32)
    tied = "lm_head.weight" not in arrays
    params["lm_head"] = params["embed"] if tied else make_linear(arrays, "lm_head", gs)
    mx.eval(params)
    return Model(cfg, params, None, {**c, "_path": str(path)})  # _path: its tokenizer.json


def load_model(path: str | Path) -> Model:
    """A GGUF file or an mlx-lm model directory."""
    path = Path(path)
    if path.is_dir():
        return load_mlx_dir(path)
    if path.suffix != ".gguf":
        raise ValueError(f"{path}: not a .gguf file or a model directory")
    return load_gguf(path)


# ---- forward -------------------------------------------------------------------------------


def rope(model: Model, x: mx.array, offset: int) -> mx.array:
    """RoPE over x [B, H, L, D] (half-split, HF convention) at positions offset..offset+L."""
    c = model.config
    base = None if model.rope_freqs is not None else c.rope_base
    return mx.fast.rope(
        x, c.head_dim, traditional=c.rope_traditional, base=base, scale=c.rope_scale, offset=offset,
        freqs=model.rope_freqs,
    )  # fmt: skip


def heads(x: mx.array, n_heads: int, head_dim: int) -> mx.array:
    b, n, _ = x.shape
    return x.reshape(b, n, n_heads, head_dim).transpose(0, 2, 1, 3)  # [B, H, n, D]


def qkv(model: Model, lp: dict, h: mx.array, offset: int):
    """Post-RoPE q [B, Hq, n, D], post-RoPE k and v [B, Hkv, n, D], and pre-RoPE k."""
    c = model.config
    q = heads(linear(lp["q"], h), c.n_heads, c.head_dim)
    k_pre = heads(linear(lp["k"], h), c.n_kv_heads, c.head_dim)
    v = heads(linear(lp["v"], h), c.n_kv_heads, c.head_dim)
    return rope(model, q, offset), rope(model, k_pre, offset), v, k_pre


def forward(model: Model, tokens: mx.array, cache, logits_from: int = 0, taps=None) -> mx.array:
    """Logits [B, n - logits_from, vocab] of tokens [B, n] at positions cache.offset.. .

    The cache stores each layer's K/V and attends (cache.attend); `taps`, a list, receives
    (k_pre_rope, k, v) per layer (float32 [B, Hkv, n, D]) for K/V capture."""
    c, p = model.config, model.params
    b, n = tokens.shape
    offset = cache.offset
    x = embed(p["embed"], tokens)  # [B, n, hidden]
    for i, lp in enumerate(p["layers"]):
        h = mx.fast.rms_norm(x, lp["attn_norm"], c.norm_eps)
        q, k, v, k_pre = qkv(model, lp, h, offset)
        if taps is not None:
            taps.append((k_pre, k, v))
        o = cache.attend(i, q, k, v, scale=c.head_dim**-0.5)  # [B, Hq, n, D]
        x = x + linear(lp["o"], o.transpose(0, 2, 1, 3).reshape(b, n, c.n_heads * c.head_dim))
        h = mx.fast.rms_norm(x, lp["ffn_norm"], c.norm_eps)
        x = x + linear(lp["down"], nn_silu(linear(lp["gate"], h)) * linear(lp["up"], h))
    cache.advance(n)
    x = mx.fast.rms_norm(x[:, logits_from:], p["norm"], c.norm_eps)
    return linear(p["lm_head"], x)


def nn_silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)
