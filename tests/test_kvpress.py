"""kvpress peer (harness/peers/kvpress.py, kvpress_build.py, side/kvpress_side.py): the bit masks,
the agreement and its trace on hand-made masks, the build's stamp logic, the side's error
path; and, where `make kvpress` built its environment and SmolLM2 is fetched, one short prompt
through kvpress with all five presses (skipped with the reason otherwise)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kvbench.peers import kvpress as K
from kvbench.peers import kvpress_build as B


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    return tmp_path


def hexes(mask: np.ndarray) -> list[str]:  # as the side writes them (packbits, big-endian bits)
    return [np.packbits(m).tobytes().hex() for m in mask]


# ---- masks, agreement, trace ------------------------------------------------------------------


def test_masks_round_trip_any_length():
    rng = np.random.default_rng(0)
    kept = rng.random((2, 3, 13)) < 0.5  # 13: not a multiple of 8, the last byte padded
    layers = [{"masks": hexes(layer)} for layer in kept]
    assert (K.masks_of(layers, 13) == kept).all()


def test_agreement_counts_by_hand():
    ours = np.zeros((1, 2, 6), bool)
    theirs = np.zeros((1, 2, 6), bool)
    ours[0, 0, [0, 1, 2]] = theirs[0, 0, [0, 1, 2]] = True  # head 0: the same three
    ours[0, 1, [0, 1, 3]] = True
    theirs[0, 1, [0, 1, 4]] = True  # head 1: one swapped
    a = K.agreement(ours, theirs)
    assert a["only_ours"].tolist() == [[0, 1]] and a["only_theirs"].tolist() == [[0, 1]]
    assert a["agree"].tolist() == [[1.0, 2 / 3]]
    assert (a["heads_equal"], a["heads"], a["layers_equal"]) == (1, 2, 0)
    with pytest.raises(ValueError, match="differ"):
        K.agreement(ours, theirs[:, :1])


def test_cut_of_is_the_kth_largest():
    s = np.array([[[0.1, 0.9, 0.5, 0.7]]])
    assert K.cut_of(s, np.array([[2]])).tolist() == [[0.7]]
    assert K.cut_of(s, np.array([[4]])).tolist() == [[0.1]]


def test_trace_names_each_cause():
    # 8 positions, keep 4. kvpress: positions 3 and 4 tie at its cut (0.5) and it kept 3.
    theirs_s = np.array([[[0.9, 0.8, 0.7, 0.5, 0.5, 0.1, 0.2, 0.3]]])
    ours_s = np.array([[[0.9, 0.8, 0.7, 0.4, 0.6, 0.1, 0.2, 0.3]]])
    theirs = theirs_s >= np.sort(theirs_s, -1)[..., -4:-3]
    theirs[0, 0, 4] = False  # kvpress's tie-break kept 3, not 4
    ours = np.zeros_like(theirs)
    ours[0, 0, [0, 1, 2, 4]] = True
    c = K.trace(ours, theirs, ours_s, theirs_s)
    assert c == {"kvpress_tie": 2, "kvbench_tie": 0, "near_tie": 0, "unexplained": 0}
    # the same swap with no tie on either side and scores far apart: unexplained
    theirs_s2 = np.array([[[0.9, 0.8, 0.7, 0.6, 0.4, 0.1, 0.2, 0.3]]])
    c = K.trace(ours, theirs, ours_s, theirs_s2)
    assert c["unexplained"] == 2 and c["kvpress_tie"] == 0
    # within rel_tol of kvbench's cut: a near tie
    ours_s3 = np.array([[[0.9, 0.8, 0.7, 0.59999, 0.6, 0.1, 0.2, 0.3]]])
    assert K.trace(ours, theirs, ours_s3, theirs_s2)["near_tie"] == 2
    assert K.trace(ours, theirs)["unexplained"] == 2  # no scores: nothing is explained
    assert K.trace(ours, theirs, None, theirs_s)["kvpress_tie"] == 2  # kvpress's side alone


def test_close_and_argmax():
    a = np.array([[1.0, 2.0, 4.0]])
    assert K.close(a, a + 1e-3) == pytest.approx({"max_abs": 1e-3, "max_rel": 1e-3 / 4.001})
    assert K.same_argmax(a, np.array([[3.0, 2.0, 1.0]])) == 0.0


def test_request_maps_policy_names_and_refuses_others():
    r = K.request("m.gguf", np.array([1, 2]), ["snapkv", "window", "KnormPress"], [0.5])
    assert r["presses"] == ["SnapKVPress", "StreamingLLMPress", "KnormPress"]
    assert r["context_ids"] == [1, 2] and r["mode"] == "kept"
    with pytest.raises(ValueError, match="h2o"):
        K.request("m.gguf", [1], ["h2o"], [0.5])


def test_press_runs_refuses_a_gather_that_failed():
    layer = {"masks": hexes(np.ones((1, 8), bool)), "gather_ok": False, "n_kept": 8}
    answer = {"context_tokens": 8, "runs": [{"press": "KnormPress", "compression_ratio": 0.5,
                                             "layers": [layer]}]}  # fmt: skip
    with pytest.raises(K.KvpressError, match="gather"):
        K.press_runs(answer)


# ---- the build's stamp and the side's errors ---------------------------------------------------


def test_env_dir_follows_the_pins(cache):
    assert B.env_dir().parent == cache / "kvpress"
    assert B.env_dir() != B.env_dir(torch="torch==2.12.0+cpu")
    assert B.env_dir() != B.env_dir(version="0.5.4")
    assert B.requirements()[0].endswith("+cpu")  # never the index's CUDA build


def test_the_environment_is_held_to_the_lock_and_follows_it(cache, tmp_path, monkeypatch):
    """A new machine builds the versions CI passed with (issue 51): every pip step of the build
    takes the lock as constraints, and a changed lock names a new environment."""
    assert "kvpress==" in B.LOCK.read_text() and "transformers==" in B.LOCK.read_text()
    lock = tmp_path / "kvpress.txt"
    lock.write_text("torch==2.13.0+cpu\n")
    monkeypatch.setattr(B, "LOCK", lock)
    before = B.env_dir()
    lock.write_text("torch==2.13.0+cpu\nkvpress==0.5.5\n")
    assert B.env_dir() != before
    steps = []
    monkeypatch.setattr(B, "run_step", lambda cmd, log: steps.append(cmd) or "{}")
    (tmp_path / "env").mkdir()
    B.install(tmp_path / "env", B.requirements(), log=None)
    pip_steps = [c for c in steps if "pip" in c]
    assert len(pip_steps) == 2 and all(["-c", str(lock)] == c[6:8] for c in pip_steps)


def test_not_built_and_failed_builds_are_skip_reasons(cache):
    assert "make kvpress" in K.missing_reason()
    B.write_stamp(B.env_dir(), {"status": "failed", "reason": "no torch==2.13.0+cpu"})
    assert "no torch==2.13.0+cpu" in K.missing_reason()
    with pytest.raises(K.KvpressError, match="failed to build"):
        K.run_side({})


def test_a_failed_install_is_recorded_and_main_exits_0_unless_strict(cache, monkeypatch, capsys):
    def fail(directory, reqs, log):
        raise B.BuildError("`pip install torch==9+cpu` exited 1")

    monkeypatch.setattr(B, "install", fail)
    assert B.main([]) == 0
    assert "exited 1" in capsys.readouterr().err
    stamp = B.read_stamp(B.env_dir())
    assert stamp["status"] == "failed" and "build.log" in stamp["reason"]
    assert B.main(["--strict"]) == 1


def test_a_built_stamp_is_returned_without_building(cache, monkeypatch):
    stamp = {"status": "ok", "python": sys.executable, "versions": {}}
    B.write_stamp(B.env_dir(), stamp)
    monkeypatch.setattr(B, "install", lambda *a: pytest.fail("rebuilt a built environment"))
    assert B.build() == stamp
    assert K.missing_reason() is None


def test_side_failure_is_one_error_with_its_stderr(cache):
    # an environment whose python is this one: the side fails to load a missing GGUF (or to
    # import torch/transformers), exits non-zero, and the error carries its last lines
    B.write_stamp(B.env_dir(), {"status": "ok", "python": sys.executable})
    with pytest.raises(K.KvpressError, match="exited"):
        K.run_side({"gguf": str(cache / "missing.gguf"), "context_ids": [1], "presses": [],
                    "ratios": []})  # fmt: skip


# ---- the real thing: SmolLM2, one short prompt, all five presses -------------------------------

RATIO = 0.5


def _why_not() -> str | None:
    from kvbench.kernels.model.fetch import model_path

    if model_path() is None:
        return "SmolLM2 not fetched: kvbench model fetch"
    return K.missing_reason()


WHY = _why_not()
needs_kvpress = pytest.mark.skipif(WHY is not None, reason=str(WHY))


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """kvpress on kvbench's passkey prompt of 320 tokens (280 context + 16 question), all five
    presses at ratio 0.5, with the full prefill's last 8 logits and every layer's keys."""
    from kvbench.kernels.model.fetch import model_path
    from kvbench.kernels.model.retrieval import build_prompt, chat_frame, make_trial, tokenizer_of

    tok, md = tokenizer_of("smollm2-135m")
    p = build_prompt(make_trial("passkey", 0), tok, 320, 0.5, 0, chat_frame(tok, md))
    cut = p.haystack[1]
    dump = tmp_path_factory.mktemp("kvpress") / "dump.npz"
    extra = {"question_ids": p.tokens[cut:], "max_new_tokens": 8, "n_logits": 8, "dump": str(dump)}
    req = K.request(model_path(), p.tokens[:cut], list(K.PRESSES), [RATIO], "answer", **extra)
    answer = K.run_side(req)
    return p, cut, answer, K.load_dump(dump)


@needs_kvpress
def test_transformers_reads_the_gguf_as_kvbench_does(short):
    """Both sides' logits and keys on the same 280 tokens: transformers dequantizes the Q4_1
    GGUF itself and un-permutes Q/K as kvbench does, so they agree to float32 rounding."""
    import mlx.core as mx

    from kvbench.kernels.model import run as R
    from kvbench.kernels.model.cache import make_cache
    from kvbench.kernels.model.fetch import model_path
    from kvbench.kernels.model.load import load_model
    from kvbench.kernels.model.spec import CacheSpec

    p, cut, _, dump = short
    model = load_model(model_path())
    cache = make_cache(CacheSpec("fp32"), model.config, cut)
    logits = np.array(R.forward(model, mx.array([p.tokens[:cut]]), cache, cut - 8)[0])
    assert K.close(logits, dump["logits"])["max_rel"] < 1e-4
    assert K.same_argmax(logits, dump["logits"]) == 1.0
    keys = np.stack([np.array(a[0]) for a in cache.arrays()[0::2]])  # [layers, kv_heads, n, d]
    assert K.close(keys, dump["keys"])["max_rel"] < 1e-4


@needs_kvpress
def test_each_press_keeps_what_its_source_says(short):
    p, cut, answer, _ = short
    runs = K.press_runs(answer)
    n_kept = int(cut * (1 - RATIO))  # kvpress.utils.compute_n_kept
    for (press, _), r in runs.items():
        assert (r.kept.sum(-1) == n_kept).all(), press
    stream = runs[("StreamingLLMPress", RATIO)].kept  # n_sink=4 first + the most recent
    want = np.zeros(cut, bool)
    want[:4] = want[cut - (n_kept - 4) :] = True
    assert (stream == want).all()
    assert runs[("SnapKVPress", RATIO)].kept[..., -64:].all()  # its window of 64 queries
    assert runs[("ExpectedAttentionPress", RATIO)].kept[..., :4].all()  # n_sink=4
    tova = runs[("TOVAPress", RATIO)].kept  # head-averaged: one set for every KV head
    assert (tova == tova[:, :1]).all()
    full, ids = K.full_answer(answer)
    assert p.answer in full and len(ids) <= 8  # the uncompressed cache finds the pass key


@needs_kvpress
def test_kvbench_policies_keep_what_kvpress_keeps(short, record_property):
    """kvbench's five policies (kernels/model/policies/) against kvpress's presses on the same
    280 context tokens at ratio 0.5, per layer and KV head: equal, or every differing position
    traced to a score tie or a near tie at the cut (float32 in torch vs MLX)."""
    from kvbench.kernels.model import policies as P
    from kvbench.kernels.model.compress import kept_positions
    from kvbench.kernels.model.fetch import model_path
    from kvbench.kernels.model.load import load_model

    p, cut, answer, dump = short
    model, runs = load_model(model_path()), K.press_runs(answer)
    for name, press in K.PRESSES.items():
        pos = kept_positions(model, p.tokens[:cut], P.make(name, P.Budget(RATIO)), ubatch=cut)
        ours = np.zeros(runs[(press, RATIO)].kept.shape, bool)
        for layer, rows in enumerate(pos):
            for h, row in enumerate(rows):
                ours[layer, h, row[row >= 0]] = True
        theirs = runs[(press, RATIO)].kept
        a = K.agreement(ours, theirs)
        record_property(name, f"{a['heads_equal']}/{a['heads']} heads equal")
        if a["heads_equal"] < a["heads"]:
            t = K.trace(ours, theirs, None, dump.get(f"{press}@{RATIO}"))
            assert t["unexplained"] == 0, (name, a["heads_equal"], t)
