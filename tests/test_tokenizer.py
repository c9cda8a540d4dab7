"""The GGUF tokenizer: a small synthetic vocabulary (merges and special tokens checked by hand),
and the real SmolLM2 vocabulary when fetched (round trips, special tokens, digit splitting)."""

import json

import mlx.core as mx
import pytest
from tokenizers import pre_tokenizers

from kvbench.kernels.model.fetch import model_path
from kvbench.kernels.model.tokenizer import (
    eog_ids,
    from_gguf_metadata,
    from_gguf_sentencepiece,
    partition,
)

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


# ---- SentencePiece vocabularies, user-defined tokens, no torch (issue #33) ---------------------


def test_partition_cuts_the_longest_tokens_first_over_the_whole_text():
    # llama.cpp's tokenizer_st_partition: longest token first, everywhere, then the next; a
    # leftmost match would take "ab" in "abcd" where llama.cpp takes "bcd"
    whole = (("bcd", 7), ("ab", 8))
    assert partition("abcd", whole) == ["a", 7]
    assert partition("ab abcd", whole) == [8, " a", 7]
    spaces = tuple((" " * n, n) for n in range(31, 1, -1))  # Gemma's runs of 2..31 spaces
    assert partition("x" + " " * 52 + "y", spaces) == ["x", 31, 21, "y"]
    assert partition("", spaces) == [] and partition("xy", spaces) == ["xy"]


# A SentencePiece vocabulary: 4 specials, 256 byte tokens, pieces scored in order (merges by
# score, as llama.cpp's SPM session merges), and user-defined newlines and runs of spaces
SPM_NORMAL = ["▁", "a", "b", "c", "ab", "▁a", "▁ab", "bc", "abc", "▁abc", "▁b", "▁▁"]
SPM_USER = ["\n", "\n\n", "  ", "   "]
SPM_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", *[f"<0x{b:02X}>" for b in range(256)],
              *SPM_NORMAL, *SPM_USER]  # fmt: skip
ID = {t: i for i, t in enumerate(SPM_TOKENS)}


def spm_metadata(space_prefix: bool) -> dict:
    n = len(SPM_NORMAL)
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": SPM_TOKENS,
        "tokenizer.ggml.scores": [0.0] * 260 + [-float(i) for i in range(n)] + [-1e3] * 4,
        "tokenizer.ggml.token_type": [3, 3, 3, 2] + [6] * 256 + [1] * n + [4] * 4,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": space_prefix,
    }


# by hand from llama.cpp's SPM rules (src/llama-vocab.cpp), the same ids llama-tokenize gives:
# user-defined tokens cut out first (longest first), a space prefix (when asked) before the
# text and after each cut token, spaces as U+2581, then pieces merged by score, byte fallback
SPM_CASES = [
    (False, "abc ab  a\n\nbc", ["<bos>", "abc", "▁ab", "  ", "a", "\n\n", "bc"]),
    (False, " abc\n   b", ["<bos>", "▁abc", "\n", "   ", "b"]),
    (True, "abc ab  a\n\nbc", ["<bos>", "▁abc", "▁ab", "  ", "▁a", "\n\n", "▁", "bc"]),
    (True, " abc\n   b", ["<bos>", "▁", "▁abc", "\n", "   ", "▁b"]),
    (True, "cab é", ["<bos>", "▁", "c", "ab", "▁", "<0xC3>", "<0xA9>"]),
]


@pytest.mark.parametrize("space_prefix, text, pieces", SPM_CASES)
def test_sentencepiece_vocabulary_by_hand(space_prefix, text, pieces):
    tok = from_gguf_sentencepiece(spm_metadata(space_prefix))
    assert tok.encode(text) == [ID[p] for p in pieces]
    if not space_prefix:  # (a prefix space after a cut token is new text: no round trip)
        assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_a_sentencepiece_vocabulary_needs_no_torch(tmp_path):
    import subprocess
    import sys

    from test_no_torch import no_torch_env

    env = no_torch_env(tmp_path)  # the block itself: test_no_torch.py test_the_block_holds
    (tmp_path / "md.json").write_text(json.dumps(spm_metadata(True)))
    code = (
        "import json, sys; from kvbench.kernels.model.tokenizer import from_gguf_sentencepiece; "
        f"md = json.load(open({str(tmp_path / 'md.json')!r})); "
        "print(json.dumps(from_gguf_sentencepiece(md).encode(' abc\\n   b')))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [ID[p] for p in SPM_CASES[3][2]]


# text llama.cpp and kvbench must cut alike: runs of spaces past Gemma's longest space token, CRLF
# (read as is), tabs, scripts, an emoji, a ligature, markup, a literal control-token name
TRICKY = ("Ünïcödé naïve café 日本語 🙂 —  tabs\t\tand   spaces    \n\n\n  indented\r\nCRLF "
          "½ ² ﬁ Ωμέγα русский <b>bold</b> <start_of_turn>user <|im_start|> 12345678 x**2"
          + " " * 52 + "end\n")  # fmt: skip


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_ids_equal_llama_tokenize(name, tmp_path):
    """Both registered models' vocabularies give the ids llama.cpp's own tokenizer gives
    (llama-tokenize, as llama-perplexity calls it) on the default text and on TRICKY."""
    import gguf

    from kvbench.kernels.model.load import gguf_metadata
    from kvbench.kernels.model.text import default_text, text_file
    from kvbench.kernels.model.tokenizer import from_gguf
    from kvbench.peers import llamacpp

    path = model_path(name)
    if path is None:
        pytest.skip(f"{name} not fetched: kvbench model fetch {name}")
    if llamacpp.llamacpp_bin("llama-tokenize") is None:
        pytest.skip(llamacpp.missing_reason("llama-tokenize"))
    tok = from_gguf(gguf_metadata(gguf.GGUFReader(str(path))))
    for i, text in enumerate((default_text(), TRICKY)):
        f = tmp_path / f"t{i}.txt"
        with open(f, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        want = llamacpp.run_tokenize(path, f)
        got = tok.encode(text_file(f))
        assert len(want) > 50 and got == want


def test_a_model_directory_goes_through_mlx_lms_loader_with_its_chat_template(tmp_path):
    from tiny_model import write_random_mlx_dir, write_tokenizer_json
    from transformers import AutoTokenizer

    from kvbench.kernels.model.load import load_model
    from kvbench.kernels.model.retrieval import chat_frame
    from kvbench.kernels.model.tokenizer import DirTokenizer, load_tokenizer

    d = write_tokenizer_json(write_random_mlx_dir(tmp_path / "m", "llama", n_layers=2))
    plain = load_tokenizer(load_model(d))
    assert isinstance(plain, DirTokenizer) and chat_frame(plain) == ("", "")  # no template
    template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "a", "eos_token": "b",
              "chat_template": template}  # fmt: skip
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(load_model(d))
    assert chat_frame(tok) == ("a<|user|>", "\n<|assistant|>")  # the template, rendered
    hf = AutoTokenizer.from_pretrained(str(d))
    text = "hello world, 123"
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False) and not tok.add_bos
    assert (tok.bos_id, tok.eos_id) == (hf.bos_token_id, hf.eos_token_id) != (None, None)


def test_end_of_generation_ids_are_llama_cpps(smol_tok):
    # SmolLM2's eos <|im_end|> (2) and <|endoftext|> (0), the two of llama.cpp's EOG texts in
    # its vocabulary; <|im_start|> (1, its bos) is not an end
    assert eog_ids(smol_tok) == {0, 2}
    assert smol_tok.decode([0, 2]) == "<|endoftext|><|im_end|>"
