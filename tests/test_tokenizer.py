"""The GGUF tokenizer: a small synthetic vocabulary (merges and special tokens checked by hand),
and the real SmolLM2 vocabulary when fetched (round trips, special tokens, digit splitting)."""

import mlx.core as mx
import pytest
from tokenizers import pre_tokenizers

from kvbench.kernels.model.fetch import model_path
from kvbench.kernels.model.tokenizer import from_gguf_metadata

ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte-level symbols


def synthetic(pre="gpt2", add_bos=False):
    tokens = ["<s>", "</s>", *ALPHABET, "he", "hel", "Ġhel"]
    types = [3, 3] + [1] * (len(tokens) - 2)
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["h e", "he l", "Ġ hel"],
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.add_bos_token": mx.array(add_bos),
    }
    return from_gguf_metadata(md), tokens


def test_merges_apply_in_rank_order():
    tok, tokens = synthetic()
    ids = tok.encode("hel hel")
    assert [tokens[i] for i in ids] == ["hel", "Ġhel"]


def test_special_tokens_are_whole_and_bos_flag():
    tok, tokens = synthetic(add_bos=True)
    ids = tok.encode("he</s>")
    assert ids[0] == 0 and ids[-1] == 1 and [tokens[i] for i in ids[1:-1]] == ["he"]
    assert tok.encode("he", add_bos=False) == [tokens.index("he")]


@pytest.mark.parametrize("text", ["hello, world", "naïve café 日本 🙂\n\t x", "  two  spaces"])
def test_synthetic_round_trip(text):
    tok, _ = synthetic()
    assert tok.decode(tok.encode(text)) == text


def test_unsupported_vocabularies():
    _, tokens = synthetic()
    with pytest.raises(ValueError, match="llama"):
        from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens})
    with pytest.raises(ValueError, match="pre"):
        synthetic(pre="no-such-pre")


REAL = model_path()


@pytest.fixture(scope="module")
def smol_tok():
    if REAL is None:
        pytest.skip("SmolLM2 not fetched: kvbench model fetch")
    _, md = mx.load(str(REAL), return_metadata=True)
    return from_gguf_metadata(md)


@pytest.mark.parametrize(
    "text",
    ["The capital of France is Paris.", "def f(x):\n    return x ** 2  # 1234", "Ünïcödé → ✓ 🙂"],
)
def test_real_round_trip(smol_tok, text):
    assert smol_tok.decode(smol_tok.encode(text)) == text


def test_real_special_tokens_and_digits(smol_tok):
    assert (smol_tok.bos_id, smol_tok.eos_id, smol_tok.add_bos) == (1, 2, False)
    ids = smol_tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and 1 not in ids[1:-1]
    # SmolLM2's pre-tokenizer splits digits one by one: five digits, five tokens
    assert len(smol_tok.encode("12345")) == 5
    assert len(smol_tok.encode(" Paris")) == 1  # a whole word of the vocabulary
