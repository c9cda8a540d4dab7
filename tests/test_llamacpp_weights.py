"""A GGUF dequantized to float32 for llama.cpp's `peer_weights: f32` rows
(harness/peers/llamacpp_weights.py): metadata kept, tensors equal to a hand dequantization,
the copy made once, bad input one line and exit 2; the axis only on llama.cpp rows; the
llama.cpp base pass's cache types as the row records them."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from kvbench.case import Case  # noqa: E402
from kvbench.engines import llamacpp as engine  # noqa: E402
from kvbench.peers import llamacpp_weights as lw  # noqa: E402
from kvbench.suite.suite import SuiteError  # noqa: E402
from kvbench.suite.validate import check_case  # noqa: E402


def q8_0_by_hand(w: np.ndarray) -> np.ndarray:
    """Q8_0 as ggml defines it, written out: per block of 32, d = max|x| / 127 stored as f16,
    q = round(x / d); the value is d * q (an independent reference for the reader's path)."""
    blocks = w.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = (amax / 127).astype(np.float16).astype(np.float32)
    q = np.round(np.divide(blocks, d, out=np.zeros_like(blocks), where=d != 0))
    return (d * q).reshape(w.shape)


@pytest.fixture
def small_gguf(tmp_path):
    rng = np.random.default_rng(0)
    w8 = rng.standard_normal((4, 64)).astype(np.float32)
    norm = rng.standard_normal(64).astype(np.float32)
    path = tmp_path / "tiny.Q8_0.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_file_type(7)  # MOSTLY_Q8_0
    w.add_token_list(["<s>", "a", "b"])
    w.add_bos_token_id(0)
    q8 = gguf.quants.quantize(w8, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, w8, norm


def _fields(reader) -> dict:
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}


def test_the_copy_holds_float32_tensors_equal_to_a_hand_dequantization(small_gguf, tmp_path):
    src, w8, norm = small_gguf
    out = tmp_path / "tiny.f32.gguf"
    assert lw.dequantize_file(src, out) == 2
    r = gguf.GGUFReader(str(out))
    tensors = {t.name: t for t in r.tensors}
    assert {t.tensor_type for t in r.tensors} == {gguf.GGMLQuantizationType.F32}
    q = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(4, 64)
    np.testing.assert_array_equal(q, q8_0_by_hand(w8))
    assert np.abs(q - w8).max() > 0  # it is the quantized weight, not the original
    np.testing.assert_array_equal(np.asarray(tensors["output_norm.weight"].data), norm)
    # every metadata field as it was, but the file type: ALL_F32
    before, after = _fields(gguf.GGUFReader(str(src))), _fields(r)
    assert after.pop("general.file_type") == lw.FILE_TYPE_ALL_F32
    assert before.pop("general.file_type") == 7
    assert after == before and after["tokenizer.ggml.tokens"] == ["<s>", "a", "b"]


def test_weights_file_makes_the_copy_once_and_gives_the_gguf_itself_as_is(
    small_gguf, tmp_path, monkeypatch
):
    src, _, _ = small_gguf
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    assert lw.weights_file(src, "gguf") == src
    out = lw.weights_file(src, "f32")
    assert out == tmp_path / "cache" / "llamacpp" / "f32-weights" / "tiny.Q8_0.f32.gguf"
    stamp = out.stat().st_mtime_ns
    calls = []
    monkeypatch.setattr(lw, "dequantize_file", lambda *a: calls.append(a))
    assert lw.weights_file(src, "f32") == out and not calls and out.stat().st_mtime_ns == stamp
    assert not list(out.parent.glob("*.tmp"))
    with pytest.raises(ValueError, match="peer_weights must be one of"):
        lw.weights_file(src, "bf16")


def test_the_command_line_refuses_a_file_that_is_not_gguf_in_one_line(tmp_path, capsys):
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model")
    assert lw.main([str(bad), str(tmp_path / "out.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{bad}: not a GGUF file") and "\n" not in err
    assert lw.main([str(bad)]) == 2


def case(**kw) -> Case:
    base = dict(model="smollm2-135m", n_layers=30, n_q_heads=9, n_kv_heads=3, head_dim=64)
    return Case(**{**base, "context_len": 64, "phase": "quality", **kw})


def test_peer_weights_is_for_llama_cpp_rows_only():
    check_case("s.yaml", case(kernel="llama.cpp", peer_weights="f32"))
    with pytest.raises(SuiteError, match="peer_weights.*only llama.cpp rows"):
        check_case("s.yaml", case(kernel="reference", peer_weights="f32"))
    assert case(peer_weights="f32").case_id != case().case_id
    assert "peer_weights" not in str(case().label())


def test_the_base_pass_runs_an_f16_cache_and_the_row_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    seen = []

    def fake_run(model, **kw):
        seen.append(kw)
        if not kw.get("kl"):  # the base pass writes its file (under a temporary name)
            kw["kl_base"].write_bytes(b"_logits_")
        out = {"ppl": 10.0, "wall_s": 1.0}
        return out | ({"kl_mean": 0.01, "ppl_base": 9.9} if kw.get("kl") else {})

    cols = ("chunk", "position", "token", "nll", "kl")
    monkeypatch.setattr(engine, "run_perplexity", fake_run)
    monkeypatch.setattr(engine, "token_pass", lambda *a: ({k: [0] for k in cols}, None))
    monkeypatch.setattr(engine, "check_tokens", lambda *a: None)
    monkeypatch.setattr(engine.llamacpp_kl, "floored_nll_fix", lambda values, ppl: values)
    monkeypatch.setattr(engine.common, "chunk_bos", lambda model: None)
    engine.base_logits.cache_clear()
    job = engine.quality_job(case(kernel="llama.cpp", kv_dtype="q8_0"), tmp_path / "m.gguf")
    res = job({}, True)
    base, run = seen
    assert (base["type_k"], base["type_v"]) == ("f16", "f16") and not base.get("kl")
    assert (run["type_k"], run["type_v"], run["kl"]) == ("q8_0", "q8_0", True)
    assert res.extra == {"peer_kv_types": "q8_0/q8_0", "peer_ref_kv_types": "f16/f16"}
    engine.base_logits.cache_clear()
