"""Model shapes: published configurations of real models, plus small ones for CPU runs.

Each figure is the model's config.json on the Hugging Face Hub (num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim or hidden_size / num_attention_heads).
"""

from __future__ import annotations

from typing import NamedTuple


class ModelShape(NamedTuple):
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    source: str
    windows: tuple = ()  # per layer None or (window, sinks): the model's sliding-window layers
    # the context it was trained for: config.json's max_position_embeddings (the GGUF's
    # <arch>.context_length); None where not recorded here. `plan --budget` names it.
    trained_context: int | None = None


# Gemma 3: every 6th layer global, the others a sliding window (gemma3.attention.sliding_window
# = 512 in the GGUF; the pattern of 6 is llama.cpp's src/models/gemma3.cpp and mlx-lm's
# gemma3_text); tests/test_plan.py checks it against the model's own make_cache
GEMMA3_270M_WINDOWS = tuple(None if (i + 1) % 6 == 0 else (512, 0) for i in range(18))


PRESETS = {
    # meta-llama/Llama-2-7b-hf: 32 layers, 32 heads (MHA), hidden 4096
    "llama-2-7b": ModelShape(
        32, 32, 32, 128, "meta-llama/Llama-2-7b-hf config.json", trained_context=4096
    ),
    # meta-llama/Llama-2-13b-hf: 40 layers, 40 heads (MHA), hidden 5120
    "llama-2-13b": ModelShape(
        40, 40, 40, 128, "meta-llama/Llama-2-13b-hf config.json", trained_context=4096
    ),
    # meta-llama/Meta-Llama-3-8B: 32 layers, 32 q heads, 8 kv heads, hidden 4096
    "llama-3-8b": ModelShape(
        32, 32, 8, 128, "meta-llama/Meta-Llama-3-8B config.json", trained_context=8192
    ),
    # meta-llama/Meta-Llama-3-70B: 80 layers, 64 q heads, 8 kv heads, hidden 8192
    "llama-3-70b": ModelShape(
        80, 64, 8, 128, "meta-llama/Meta-Llama-3-70B config.json", trained_context=8192
    ),
    # mistralai/Mistral-7B-v0.1: 32 layers, 32 q heads, 8 kv heads, hidden 4096
    "mistral-7b": ModelShape(
        32, 32, 8, 128, "mistralai/Mistral-7B-v0.1 config.json", trained_context=32768
    ),
    # Qwen/Qwen2-7B: 28 layers, 28 q heads, 4 kv heads, hidden 3584
    "qwen2-7b": ModelShape(28, 28, 4, 128, "Qwen/Qwen2-7B config.json"),
    # meta-llama/Llama-3.2-1B: 16 layers, 32 q heads, 8 kv heads, head_dim 64
    "llama-3.2-1b": ModelShape(
        16, 32, 8, 64, "meta-llama/Llama-3.2-1B config.json", trained_context=131072
    ),
    # Qwen/Qwen2-0.5B: 24 layers, 14 q heads, 2 kv heads, hidden 896
    "qwen2-0.5b": ModelShape(24, 14, 2, 64, "Qwen/Qwen2-0.5B config.json"),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T: 22 layers, 32 q, 4 kv, hidden 2048
    "tinyllama-1.1b": ModelShape(
        22, 32, 4, 64, "TinyLlama/TinyLlama-1.1B config.json", trained_context=2048
    ),
    # HuggingFaceTB/SmolLM-135M: 30 layers, 9 q heads, 3 kv heads, hidden 576
    "smollm-135m": ModelShape(
        30, 9, 3, 64, "HuggingFaceTB/SmolLM-135M config.json", trained_context=2048
    ),
    # HuggingFaceTB/SmolLM2-135M-Instruct (the GGUF `kvbench model fetch` brings): the same
    # shape; the model engine runs its real weights (docs/quality.md)
    "smollm2-135m": ModelShape(
        30, 9, 3, 64, "SmolLM2-135M-Instruct GGUF metadata", trained_context=8192
    ),
    # Gemma-3-270M Q4_K_M GGUF (`kvbench model fetch gemma3-270m`): sliding-window layers
    "gemma3-270m": ModelShape(
        18, 4, 1, 256, "gemma-3-270m-q4_k_m.gguf metadata", GEMMA3_270M_WINDOWS, 32768
    ),  # fmt: skip
    # Synthetic shapes sized for the reference-BLAS CPU backend (not a real model).
    "tiny": ModelShape(2, 8, 2, 64, "synthetic (CPU tests)"),
    "small": ModelShape(4, 16, 4, 64, "synthetic (CPU suites)"),
}
