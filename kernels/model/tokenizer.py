"""Tokenizer of a model, with no torch: a GGUF's own vocabulary rebuilt with the `tokenizers`
library, or an mlx-lm directory's tokenizer through mlx-lm's loader (its chat template too).

GGUF keeps the vocabulary (`tokenizer.ggml.tokens`), the merges (`tokenizer.ggml.merges`), the
token types (`tokenizer.ggml.token_type`: 3 = control, 4 = user-defined, both matched whole as
special tokens) and bos/eos ids. Byte-level BPE (`tokenizer.ggml.model` "gpt2": SmolLM2, Llama 3,
Qwen2): the pre-tokenizer split depends on `tokenizer.ggml.pre`, the regexes below are those
llama.cpp uses for each name (src/llama-vocab.cpp). SentencePiece vocabularies ("llama": Gemma,
Llama 2, Mistral) carry scores, not merges: they go through transformers' GGUF tokenizer
converter (`convert_gguf_tokenizer`, which rebuilds the merges from the vocabulary), fed from the
metadata kvbench has already read: transformers' own GGUF reader imports torch, the converter
does not (transformers comes with mlx-lm; tests/test_tokenizer.py runs it with torch blocked).
Token ids equal llama.cpp's `llama-tokenize` on both registered models' texts (docs/peers.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

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
CONTROL, USER_DEFINED = 3, 4
SPM_SPACE = "\u2581"  # SentencePiece's space


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


def partition(text: str, whole: tuple[tuple[str, int], ...]) -> list[str | int]:
    """The text cut at every occurrence of the tokens in `whole` (text, id), longest first, as
    llama.cpp's tokenizer_st_partition cuts at user-defined tokens before tokenizing the rest
    (src/llama-vocab.cpp): each token in turn, each remaining text fragment split at its
    occurrences left to right; empty fragments dropped. -> text fragments and token ids."""
    out: list[str | int] = [text] if text else []
    for piece, tid in whole:
        cut: list[str | int] = []
        for frag in out:
            if isinstance(frag, int) or piece not in frag:
                cut.append(frag)
                continue
            for i, part in enumerate(frag.split(piece)):
                cut += ([tid] if i else []) + ([part] if part else [])
        out = cut
    return out


def user_defined(md: dict) -> tuple[tuple[str, int], ...]:
    """The vocabulary's user-defined tokens (type 4: Gemma's runs of spaces and newlines) as
    llama.cpp orders them for partition: by length, longest first (ties by id)."""
    types = md.get("tokenizer.ggml.token_type")
    types = types.tolist() if hasattr(types, "tolist") else list(types or [])
    tokens = md.get("tokenizer.ggml.tokens") or []
    found = [(t, i) for i, (t, ty) in enumerate(zip(tokens, types)) if ty == USER_DEFINED and t]
    return tuple(sorted(found, key=lambda x: (-len(x[0].encode("utf-8")), x[1])))


@dataclass
class TextTokenizer:
    tok: Tokenizer
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    whole: tuple[tuple[str, int], ...] = ()  # matched whole before the rest (partition)
    space_prefix: bool = False  # SentencePiece's add_space_prefix, as llama.cpp applies it

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        parts = partition(text, self.whole)
        if self.space_prefix:  # llama.cpp: a space before the text and after each whole token
            parts = [" " + p if isinstance(p, str) and (i == 0 or isinstance(parts[i - 1], int))
                     else p for i, p in enumerate(parts)]  # fmt: skip
        texts = [p for p in parts if isinstance(p, str)]
        coded = iter(self.tok.encode_batch(texts, add_special_tokens=False))
        ids = [i for p in parts for i in ([p] if isinstance(p, int) else next(coded).ids)]
        bos = self.add_bos if add_bos is None else add_bos
        return [self.bos_id, *ids] if bos and self.bos_id is not None else ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)


# The texts llama.cpp counts as the end of generation besides the vocabulary's eos / eot / eom ids
# (src/llama-vocab.cpp, b11434: `special_eog_ids` in load(); passkey.cpp and llama-cli stop at
# `llama_vocab_is_eog`). kvpress's pipeline stops at the model's generation_config eos ids.
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
             "[e~[")  # fmt: skip


def eog_ids(tokenizer: TextTokenizer) -> frozenset[int]:
    """The ids a greedy answer stops at (not part of its text): the eos id and every token of
    the vocabulary whose text is in EOG_TEXTS, as llama.cpp's vocabulary marks them."""
    found = {tokenizer.tok.token_to_id(t) for t in EOG_TEXTS}
    found.add(tokenizer.eos_id)
    return frozenset(int(i) for i in found if i is not None)


def _val(md: dict, key: str, default=None):
    v = md.get(key, default)
    return v.item() if hasattr(v, "item") else v


# transformers' tokenizer-dict keys, from the GGUF keys under "tokenizer.ggml."
SPM_KEYS = {"model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens",
            "scores": "scores", "token_type": "token_type", "merges": "merges",
            "add_space_prefix": "add_prefix_space"}  # fmt: skip


def from_gguf_sentencepiece(md: dict) -> TextTokenizer:
    """A SentencePiece GGUF vocabulary (`tokenizer.ggml.model` "llama") through transformers'
    converter, from the metadata alone (no torch, no second read of the file). llama.cpp adds
    BOS to such a vocabulary unless the file says otherwise (src/llama-vocab.cpp)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tdict = {
        k: md[f"tokenizer.ggml.{g}"] for g, k in SPM_KEYS.items() if f"tokenizer.ggml.{g}" in md
    }
    tdict = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in tdict.items()}
    converted, _ = convert_gguf_tokenizer(_val(md, "general.architecture", "llama"), tdict)
    # Its model (vocabulary and merges) only, around it llama.cpp's SentencePiece session: every
    # space becomes U+2581, no split into words, the prefix space only where add_space_prefix
    # says and user-defined tokens cut out first (TextTokenizer.encode); transformers' Metaspace
    # would prepend a space to every piece and skip it before a leading space, and its added
    # user-defined tokens would match inside that prefix
    tok = Tokenizer(converted.model)
    tok.add_special_tokens(
        [t for t, ty in zip(tdict["tokens"], tdict["token_type"]) if ty == CONTROL]
    )
    prefix = bool(_val(md, "tokenizer.ggml.add_space_prefix", True))
    tok.normalizer = normalizers.Replace(" ", SPM_SPACE)
    tok.pre_tokenizer = None
    strip = [decoders.Strip(" ", 1, 0)] if prefix else []
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return TextTokenizer(
        tok,
        _val(md, "tokenizer.ggml.bos_token_id"),
        _val(md, "tokenizer.ggml.eos_token_id"),
        bool(_val(md, "tokenizer.ggml.add_bos_token", True)),
        user_defined(md),
        prefix,
    )


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
        user_defined(md),
    )


@dataclass
class DirTokenizer(TextTokenizer):
    """An mlx-lm directory's tokenizer as mlx-lm loads it (`mlx_lm.utils.load_tokenizer`:
    transformers' AutoTokenizer from tokenizer.json and tokenizer_config.json), with its chat
    template; encodes with the same fast tokenizer."""

    wrapper: object = None  # mlx-lm's TokenizerWrapper

    def apply_chat_template(self, messages: list[dict], **kwargs) -> str:
        """The chat template rendered (text), or "" when the model has none."""
        if not self.wrapper.has_chat_template:
            return ""
        return self.wrapper.apply_chat_template(messages, **{**kwargs, "tokenize": False})


def from_model_dir(path: str | Path) -> DirTokenizer:
    from mlx_lm.utils import load_tokenizer as mlx_lm_tokenizer

    wrapper = mlx_lm_tokenizer(Path(path))
    hf = wrapper._tokenizer
    bos = hf.bos_token_id
    # whether the model's tokenizer puts BOS in front of a text (Llama 3 does, Qwen2 does not)
    add = (
        bos is not None
        and hf.encode("a")[:1] == [bos] != hf.encode("a", add_special_tokens=False)[:1]
    )
    return DirTokenizer(hf.backend_tokenizer, bos, hf.eos_token_id, add, wrapper=wrapper)


def from_gguf(md: dict) -> TextTokenizer:
    """A GGUF's own vocabulary (its metadata): SentencePiece or byte-level BPE."""
    if _val(md, "tokenizer.ggml.model") == "llama":
        return from_gguf_sentencepiece(md)
    return from_gguf_metadata(md)


def load_tokenizer(model) -> TextTokenizer:
    """The tokenizer of a kernels/model/load.py Model: its GGUF's own vocabulary, or its
    directory's tokenizer (mlx-lm's loader)."""
    md = model.metadata
    if "tokenizer.ggml.tokens" in md:
        return from_gguf(md)
    path = Path(model.path or ".")
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return from_model_dir(path)
    raise ValueError(f"{model.path}: no tokenizer (GGUF vocabulary or tokenizer.json)")
