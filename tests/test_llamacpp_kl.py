"""llama.cpp's saved distributions (harness/peers/llamacpp_kl.py): a file written here by the
format's rules (tools/perplexity/perplexity.cpp) read back, agreement by hand, and the count of
tokens before the first difference."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.peers.llamacpp_kl import agreement, read_kl_base, tokens_to_difference


def write_base(path, logits: np.ndarray, tokens: np.ndarray) -> None:
    """As llama-perplexity writes it: header, tokens, then per scored position the two float32s
    (scale, min_log_prob) and one uint16 per token (log_softmax in perplexity.cpp)."""
    n_chunk, n_ctx = tokens.shape
    n_vocab = logits.shape[-1]
    nv = 2 * ((n_vocab + 1) // 2) + 4
    out = [b"_logits_", np.array([n_ctx, n_vocab, n_chunk], np.int32).tobytes(),
           tokens.astype(np.int32).tobytes()]  # fmt: skip
    for row in logits.reshape(-1, n_vocab):
        mx_, mn = row.max(), max(row.min(), row.max() - 16)
        lse = np.log(np.exp(row - mx_).sum())
        scale = (mx_ - mn) / 65535
        q = np.where(row > mn, np.rint((row - mn) / scale), 0).astype(np.uint16)
        rec = np.zeros(nv, np.uint16)
        rec[:4] = np.array([scale, mn - mx_ - lse], np.float32).view(np.uint16)
        rec[4 : 4 + n_vocab] = q
        out.append(rec.tobytes())
    path.write_bytes(b"".join(out))


def test_a_base_file_reads_back_as_its_distributions(tmp_path):
    rng = np.random.default_rng(0)
    n_ctx, n_vocab, n_chunk = 8, 5, 2
    scored = n_ctx - 1 - n_ctx // 2  # 3 positions: 4, 5, 6
    logits = rng.normal(0, 2, (n_chunk, scored, n_vocab)).astype(np.float32)
    tokens = rng.integers(0, n_vocab, (n_chunk, n_ctx))
    write_base(tmp_path / "b.kld", logits, tokens)
    base = read_kl_base(tmp_path / "b.kld")
    assert (base["n_ctx"], base["n_vocab"], base["n_chunk"]) == (8, 5, 2)
    assert (base["tokens"] == tokens).all()
    for c in range(n_chunk):
        want = logits[c] - np.log(np.exp(logits[c]).sum(-1, keepdims=True))
        # within the file's rounding: 16 nats / 65535 at most per value (here the spread is less)
        assert np.allclose(base["logprobs"](c), want, atol=3e-4)
    (tmp_path / "bad.kld").write_bytes(b"_logits_" + bytes(12))
    with pytest.raises(ValueError, match="bad.kld"):
        read_kl_base(tmp_path / "bad.kld")


def test_agreement_by_hand():
    base = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.6, 0.3]]))
    lp = np.log(np.array([[0.25, 0.5, 0.25], [0.1, 0.6, 0.3]]))
    got = agreement(base, lp)
    assert got["top1_agree"] == 0.5 and got["n"] == 2
    # KL(base || lp) row 0: 0.5 ln 2 + 0.25 ln(1/2) = 0.25 ln 2; row 1: 0
    assert got["kl"] == pytest.approx([0.25 * np.log(2), 0.0], abs=1e-12)


def test_tokens_to_the_first_difference():
    assert tokens_to_difference([" the", " cat", " sat"], " the cat sat") == 3
    assert tokens_to_difference([" the", " cat", " sat"], " the cow sat") == 1
    assert tokens_to_difference([" the", " ca", "t"], " the cat") == 3  # another cut, same text
    assert tokens_to_difference(["x"], " the") == 0
