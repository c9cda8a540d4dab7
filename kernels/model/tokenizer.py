"""Tokenizer of a model: byte-level BPE rebuilt from GGUF metadata with the `tokenizers` library,
or a model directory's tokenizer.json.

GGUF keeps the vocabulary (`tokenizer.ggml.tokens`), the merges (`tokenizer.ggml.merges`), the
token types (`tokenizer.ggml.token_type`: 3 = control, 4 = user-defined, both matched whole as
special tokens) and bos/eos ids. The pre-tokenizer split depends on `tokenizer.ggml.pre`: the
regexes below are those llama.cpp uses for each name (src/llama-vocab.cpp). SentencePiece
vocabularies (`tokenizer.ggml.model` "llama": Gemma, Llama 2, Mistral) carry scores, not
merges: they go through transformers' own GGUF tokenizer conversion (`from_gguf_file`).
This module stays (issue #24) because mlx-lm reads tokenizers from directories only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TYPES = (3, 4)  # control, user-defined


def _split(pattern: str):
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated")


def _byte_level():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


# tokenizer.ggml.pre -> pre-tokenizer steps (then byte-level mapping)
PRE = {
    "gpt2": lambda: [_split(GPT2_SPLIT)],
    "smollm": lambda: [pre_tokenizers.Digits(individual_digits=True), _split(GPT2_SPLIT)],
    "llama-bpe": lambda: [_split(LLAMA3_SPLIT)],
    "qwen2": lambda: [_split(QWEN2_SPLIT)],
}


@dataclass
class TextTokenizer:
    tok: Tokenizer
    bos_id: int | None
    eos_id: int | None
    add_bos: bool

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        bos = self.add_bos if add_bos is None else add_bos
        return [self.bos_id, *ids] if bos and self.bos_id is not None else ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)


def _val(md: dict, key: str, default=None):
    v = md.get(key, default)
    return v.item() if hasattr(v, "item") else v


def from_gguf_file(path: str | Path, md: dict) -> TextTokenizer:
    """A SentencePiece-style GGUF vocabulary (`tokenizer.ggml.model` "llama": Gemma, Llama 2)
    through transformers' GGUF tokenizer conversion (AutoTokenizer with gguf_file)."""
    from transformers import AutoTokenizer

    path = Path(path)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    add = bool(_val(md, "tokenizer.ggml.add_bos_token", True))
    return TextTokenizer(hf.backend_tokenizer, hf.bos_token_id, hf.eos_token_id, add)


def from_gguf_metadata(md: dict) -> TextTokenizer:
    kind, pre = _val(md, "tokenizer.ggml.model"), _val(md, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE only)")
    if pre not in PRE:
        raise ValueError(f"GGUF tokenizer.ggml.pre {pre!r} unknown; known: {', '.join(PRE)}")
    tokens = list(md["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([*PRE[pre](), _byte_level()])
    tok.decoder = decoders.ByteLevel()
    types = md.get("tokenizer.ggml.token_type")
    types = types.tolist() if hasattr(types, "tolist") else list(types or [])
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty in SPECIAL_TYPES])
    return TextTokenizer(
        tok,
        _val(md, "tokenizer.ggml.bos_token_id"),
        _val(md, "tokenizer.ggml.eos_token_id"),
        bool(_val(md, "tokenizer.ggml.add_bos_token", False)),
    )


def from_model_dir(path: str | Path) -> TextTokenizer:
    path = Path(path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    import json

    cfg = json.loads((path / "config.json").read_text())
    return TextTokenizer(tok, cfg.get("bos_token_id"), cfg.get("eos_token_id"), False)


def load_tokenizer(model) -> TextTokenizer:
    """The tokenizer of a kernels/model/load.py Model: its GGUF's own vocabulary, or its
    directory's tokenizer.json."""
    md = model.metadata
    if "tokenizer.ggml.tokens" in md and _val(md, "tokenizer.ggml.model") == "llama":
        return from_gguf_file(model.path, md)
    if "tokenizer.ggml.tokens" in md:
        return from_gguf_metadata(md)
    path = Path(model.path or ".")
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return from_model_dir(path)
    raise ValueError(f"{model.path}: no tokenizer (GGUF vocabulary or tokenizer.json)")
