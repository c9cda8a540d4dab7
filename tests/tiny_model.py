"""A tiny Llama-family model with known random weights, written as a GGUF file (Q/K rows
permuted the way llama.cpp's converter writes them) and as an mlx-lm directory, plus an
independent numpy forward pass in Hugging Face's convention (half-split RoPE) to check the
MLX driver against."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

# head_dim 64 (not hidden / n_heads = 32): every kvbench format applies, and the loaders must
# read the head size from the metadata (attention.key_length / head_dim)
TINY = dict(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=64, ffn=192, vocab=300)
ROPE_BASE, EPS = 10000.0, 1e-5
LAYER_NAMES = ("q", "k", "v", "o", "gate", "up", "down", "attn_norm", "ffn_norm")


def weights(seed: int = 0, qkv_bias: bool = False, tied: bool = True, head_dim=None) -> dict:
    """HF-order float32 weights: {"embed", "norm", ["lm_head"], "layers": [dict]}; head_dim
    (default TINY's) may differ from hidden / n_heads."""
    t, rng = TINY, np.random.default_rng(seed)
    d = head_dim or t["head_dim"]
    hq, hkv, h = t["n_heads"] * d, t["n_kv_heads"] * d, t["hidden"]
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)  # noqa: E731
    layers = []
    for _ in range(t["n_layers"]):
        lp = {"q": w(hq, h), "k": w(hkv, h), "v": w(hkv, h), "o": w(h, hq)}
        lp.update(gate=w(t["ffn"], h), up=w(t["ffn"], h), down=w(h, t["ffn"]))
        lp["attn_norm"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        lp["ffn_norm"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        if qkv_bias:
            for n, rows in (("q", hq), ("k", hkv), ("v", hkv)):
                lp[n + "_bias"] = (0.1 * rng.standard_normal(rows)).astype(np.float32)
        layers.append(lp)
    out = {"embed": w(t["vocab"], h), "norm": np.ones(h, np.float32), "layers": layers}
    if not tied:
        out["lm_head"] = w(t["vocab"], h)
    return out


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's permute: HF half-split rows -> interleaved pairs."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


GGUF_NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
              "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down",
              "attn_norm": "attn_norm", "ffn_norm": "ffn_norm"}  # fmt: skip


def write_gguf(path: Path, wts: dict, arch: str = "llama", metadata: dict | None = None) -> Path:
    """The tiny model as a GGUF; `metadata`: more keys (a tokenizer.ggml.* vocabulary)."""
    t = TINY
    arrays = {"token_embd.weight": wts["embed"], "output_norm.weight": wts["norm"]}
    if "lm_head" in wts:
        arrays["output.weight"] = wts["lm_head"]
    for i, lp in enumerate(wts["layers"]):
        for n, g in GGUF_NAMES.items():
            a = lp[n]
            if arch == "llama" and n in ("q", "k"):
                a = permute(a, t["n_heads"] if n == "q" else t["n_kv_heads"])
            arrays[f"blk.{i}.{g}.weight"] = a
        for n in ("q", "k", "v"):
            if n + "_bias" in lp:
                arrays[f"blk.{i}.{GGUF_NAMES[n]}.bias"] = lp[n + "_bias"]
    u = lambda x: mx.array(x, dtype=mx.uint32)  # noqa: E731
    md = {
        "general.architecture": arch,
        f"{arch}.block_count": u(t["n_layers"]),
        f"{arch}.embedding_length": u(t["hidden"]),
        f"{arch}.feed_forward_length": u(t["ffn"]),
        f"{arch}.context_length": u(256),
        f"{arch}.attention.head_count": u(t["n_heads"]),
        f"{arch}.attention.head_count_kv": u(t["n_kv_heads"]),
        f"{arch}.attention.key_length": u(t["head_dim"]),
        f"{arch}.vocab_size": u(t["vocab"]),
        f"{arch}.rope.freq_base": mx.array(ROPE_BASE, dtype=mx.float32),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(EPS, dtype=mx.float32),
    }
    mx.save_gguf(str(path), {k: mx.array(v) for k, v in arrays.items()}, {**md, **(metadata or {})})
    return path


HF_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
            "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
            "down": "mlp.down_proj", "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm"}  # fmt: skip


QUANT_GROUP = 64


def quantize_linears(arrays: dict, bits: int) -> dict:
    """mlx-lm's layout: every 2-D weight as .weight (packed) / .scales / .biases."""
    out = {}
    for name, a in arrays.items():
        if a.ndim == 2:
            w, s, b = mx.quantize(a, group_size=QUANT_GROUP, bits=bits)
            stem = name[: -len(".weight")]
            out.update({name: w, f"{stem}.scales": s, f"{stem}.biases": b})
        else:
            out[name] = a
    return out


def dequantized(wts: dict, bits: int) -> dict:
    """wts with every matrix replaced by its quantize -> dequantize round trip (float32)."""

    def rt(a):
        if a.ndim != 2:
            return a
        q = mx.quantize(mx.array(a), group_size=QUANT_GROUP, bits=bits)
        return np.array(mx.dequantize(*q, group_size=QUANT_GROUP, bits=bits))

    out = {k: rt(v) for k, v in wts.items() if k != "layers"}
    out["layers"] = [{k: rt(v) for k, v in lp.items()} for lp in wts["layers"]]
    return out


def write_mlx_dir(path: Path, wts: dict, bits: int | None = None) -> Path:
    t = TINY
    path.mkdir(parents=True, exist_ok=True)
    arrays = {"model.embed_tokens.weight": wts["embed"], "model.norm.weight": wts["norm"]}
    for i, lp in enumerate(wts["layers"]):
        for n, hf in HF_NAMES.items():
            arrays[f"model.layers.{i}.{hf}.weight"] = lp[n]
            if n + "_bias" in lp:
                arrays[f"model.layers.{i}.{hf}.bias"] = lp[n + "_bias"]
    mlx_arrays = {k: mx.array(v) for k, v in arrays.items()}
    if bits:
        mlx_arrays = quantize_linears(mlx_arrays, bits)
    mx.save_safetensors(str(path / "model.safetensors"), mlx_arrays)
    cfg = {"model_type": "llama", "num_hidden_layers": t["n_layers"], "hidden_size": t["hidden"],
           "num_attention_heads": t["n_heads"], "num_key_value_heads": t["n_kv_heads"],
           "vocab_size": t["vocab"], "rope_theta": ROPE_BASE, "rms_norm_eps": EPS,
           "intermediate_size": t["ffn"], "tie_word_embeddings": True,
           "head_dim": t["head_dim"]}  # fmt: skip
    if bits:
        cfg["quantization"] = {"group_size": QUANT_GROUP, "bits": bits}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


# ---- numpy reference forward (float64) ---------------------------------------------------------


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rope_half(x: np.ndarray) -> np.ndarray:
    """HF rotate_half RoPE of x [H, L, D] at positions 0..L-1."""
    _, n, d = x.shape
    inv = ROPE_BASE ** (-np.arange(0, d, 2) / d)  # [D/2]
    ang = np.arange(n)[:, None] * inv[None, :]  # [L, D/2]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def attention(q, k, v, last_sees=None):
    """q [Hq, L, D], k/v [Hkv, L, D], causal, GQA by repeating K/V heads; last_sees: bool
    [Hkv, L], the positions the last query sees (default: all, causal)."""
    g = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    n = q.shape[1]
    seen = np.broadcast_to(np.tril(np.ones((n, n), bool)), s.shape).copy()
    if last_sees is not None:
        seen[:, -1] = np.repeat(last_sees, g, axis=0)
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def project(lp: dict, h: np.ndarray, name: str, n_heads: int) -> np.ndarray:
    """[L, hidden] -> [H, L, D] through projection `name` (with its bias if any)."""
    y = h @ lp[name].T + lp.get(name + "_bias", 0)
    return y.reshape(h.shape[0], n_heads, -1).transpose(1, 0, 2)


def np_forward(wts: dict, tokens: list[int], last_sees=None) -> np.ndarray:
    """Logits [L, vocab] in float64; last_sees: per layer, bool [Hkv, L] the positions the
    last token attends to (a cache that kept only those; default: every earlier one)."""
    t = TINY
    n = len(tokens)
    x = wts["embed"][tokens].astype(np.float64)
    for i, lp in enumerate(wts["layers"]):
        h = rms(x, lp["attn_norm"])
        q = rope_half(project(lp, h, "q", t["n_heads"]))
        k = rope_half(project(lp, h, "k", t["n_kv_heads"]))
        sees = None if last_sees is None else last_sees[i]
        o = attention(q, k, project(lp, h, "v", t["n_kv_heads"]), sees)  # [Hq, L, D]
        x = x + o.transpose(1, 0, 2).reshape(n, -1) @ lp["o"].T
        h = rms(x, lp["ffn_norm"])
        g = h @ lp["gate"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ lp["up"].T)) @ lp["down"].T
    return rms(x, wts["norm"]) @ wts.get("lm_head", wts["embed"]).T


# ---- GGUF through gguf.GGUFWriter (what llama.cpp's converter uses) ----------------------------


def write_gguf_writer(path: Path, wts: dict, arch: str = "llama", context_len: int = 256) -> Path:
    """The tiny model as llama.cpp's converter writes it: gguf.GGUFWriter, Q/K rows permuted for
    `llama`, float32 tensors, metadata under `<arch>.`."""
    import gguf

    t = TINY
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(t["n_layers"])
    w.add_context_length(context_len)
    w.add_embedding_length(t["hidden"])
    w.add_feed_forward_length(t["ffn"])
    w.add_head_count(t["n_heads"])
    w.add_head_count_kv(t["n_kv_heads"])
    head_dim = wts["layers"][0]["q"].shape[0] // t["n_heads"]
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_vocab_size(t["vocab"])
    w.add_tensor("token_embd.weight", wts["embed"])
    w.add_tensor("output_norm.weight", wts["norm"])
    if "lm_head" in wts:
        w.add_tensor("output.weight", wts["lm_head"])
    for i, lp in enumerate(wts["layers"]):
        for n, g in GGUF_NAMES.items():
            a = lp[n]
            if arch == "llama" and n in ("q", "k"):
                a = permute(a, t["n_heads"] if n == "q" else t["n_kv_heads"])
            w.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(a))
        for n in ("q", "k", "v"):
            if n + "_bias" in lp:
                w.add_tensor(f"blk.{i}.{GGUF_NAMES[n]}.bias", lp[n + "_bias"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- any mlx-lm architecture, random weights -------------------------------------------------

ARCH_CONFIGS = {
    "llama": dict(intermediate_size=192, rope_theta=ROPE_BASE, tie_word_embeddings=True),
    "qwen2": dict(intermediate_size=192, rope_theta=ROPE_BASE, tie_word_embeddings=True),
    # gemma3: layers 0-2 slide over a window of 8 positions, layer 3 is global
    "gemma3_text": dict(intermediate_size=192, sliding_window=8, sliding_window_pattern=4,
                        query_pre_attn_scalar=64, rope_local_base_freq=ROPE_BASE),
}  # fmt: skip


def write_random_mlx_dir(
    path: Path, model_type: str, seed: int = 0, n_layers: int = 2, **extra
) -> Path:
    """An mlx-lm directory of `model_type` with seeded random weights (mlx-lm builds the model,
    so the parameter names are mlx-lm's own)."""
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.utils import _get_classes

    t = TINY
    cfg = {"model_type": model_type, "hidden_size": t["hidden"], "num_hidden_layers": n_layers,
           "num_attention_heads": t["n_heads"], "num_key_value_heads": t["n_kv_heads"],
           "head_dim": t["head_dim"], "vocab_size": t["vocab"], "rms_norm_eps": EPS,
           "max_position_embeddings": 256, **ARCH_CONFIGS[model_type], **extra}  # fmt: skip
    model_class, args_class = _get_classes(cfg)
    net = model_class(args_class.from_dict(cfg))
    rng = np.random.default_rng(seed)
    net.update(tree_map(lambda a: mx.array(rng.standard_normal(a.shape).astype(np.float32)
                                           / np.sqrt(a.shape[-1])), net.parameters()))  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(net.parameters())))
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def write_tokenizer_json(path: Path, vocab: int = 300) -> Path:
    """A byte-level BPE tokenizer.json of `vocab` tokens (256 bytes + merges), trained on the
    default text, so a tiny model directory can run the model phases end to end."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from kvbench.kernels.model.text import default_text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([default_text()[:50_000]], trainer)
    tok.save(str(path / "tokenizer.json"))
    # a generic fast tokenizer, as such a directory declares it (else transformers picks the
    # model type's own class, which expects that model's vocabulary)
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path
