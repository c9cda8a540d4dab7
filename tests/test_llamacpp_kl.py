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


def test_per_token_values_of_two_saved_passes(tmp_path):
    # llama.cpp's base pass and a pass to judge, both saved: each scored token's nll (of the
    # judged pass) and KL(base || judged), against the exact float64 values of the logits
    from kvbench.peers.llamacpp_kl import token_values

    rng = np.random.default_rng(1)
    n_ctx, n_vocab, n_chunk = 10, 7, 2
    scored = n_ctx - 1 - n_ctx // 2  # positions 5..8
    base = rng.normal(0, 2, (n_chunk, scored, n_vocab)).astype(np.float32)
    run = (base + rng.normal(0, 0.3, base.shape)).astype(np.float32)
    tokens = rng.integers(0, n_vocab, (n_chunk, n_ctx))
    write_base(tmp_path / "b.kld", base, tokens)
    write_base(tmp_path / "r.kld", run, tokens)
    got = token_values(read_kl_base(tmp_path / "b.kld"), read_kl_base(tmp_path / "r.kld"), block=3)
    lsm = lambda x: x - np.log(np.exp(x.astype(np.float64)).sum(-1, keepdims=True))  # noqa: E731
    b_lp, r_lp = lsm(base), lsm(run)
    targets = tokens[:, n_ctx // 2 + 1 :]
    assert got["chunk"].tolist() == [0] * 4 + [1] * 4
    assert got["position"].tolist() == [5, 6, 7, 8] * 2 and (got["token"] == targets.ravel()).all()
    nll = -np.take_along_axis(r_lp, targets[..., None], -1).ravel()
    kl = (np.exp(b_lp) * (b_lp - r_lp)).sum(-1).ravel()
    # each within the files' rounding (16 nats / 65535 per saved value; here the spread is less)
    assert np.allclose(got["nll"], nll, atol=3e-4) and np.allclose(got["kl"], kl, atol=3e-4)
    same = token_values(read_kl_base(tmp_path / "b.kld"), read_kl_base(tmp_path / "b.kld"))
    assert (same["kl"] == 0).all()  # a pass against itself: exactly no divergence
    write_base(tmp_path / "o.kld", run, (tokens + 1) % n_vocab)
    with pytest.raises(ValueError, match="different tokens"):
        token_values(read_kl_base(tmp_path / "b.kld"), read_kl_base(tmp_path / "o.kld"))


def test_a_true_token_under_the_files_floor_gets_its_nll_back_from_the_printed_ppl(tmp_path):
    # a target 25 nats under the top is saved at the floor (about -16 nats): its nll too small.
    # The exact perplexity (as llama-perplexity prints it, from its float logits) puts it back.
    from kvbench.peers.llamacpp_kl import floored_nll_fix, token_values

    rng = np.random.default_rng(2)
    n_ctx, n_vocab = 10, 6
    logits = rng.normal(0, 1, (1, 4, n_vocab)).astype(np.float32)
    tokens = rng.integers(0, n_vocab, (1, n_ctx))
    tokens[0, 7] = 0  # the target of scored position 6 (index 1)
    logits[0, 1, 0] = logits[0, 1].max() - 25
    write_base(tmp_path / "b.kld", logits, tokens)
    f = read_kl_base(tmp_path / "b.kld")
    got = token_values(f, f)
    assert got["floored"].tolist() == [False, True, False, False]
    lp = logits[0].astype(np.float64)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    exact = -lp[np.arange(4), tokens[0, 6:]]
    assert got["nll"][1] < exact[1] - 8  # floored
    fixed = floored_nll_fix(got, float(np.exp(exact.mean())))["nll"]
    assert np.allclose(fixed, exact, atol=1e-3)
    with pytest.raises(ValueError, match="off the printed ppl"):  # a ppl under the saved values
        floored_nll_fix(got, float(np.exp(got["nll"].mean() - 0.1)))
    unfloored = {**got, "floored": np.zeros(4, bool)}
    with pytest.raises(ValueError, match="0 floored tokens"):  # nothing floored, far off
        floored_nll_fix(unfloored, float(np.exp(exact.mean())))
