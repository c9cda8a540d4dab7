"""llama.cpp's passkey prompt (kernels/model/passkey.py) against passkey.cpp's own rule, the
parse of llama-passkey's output (harness/peers/llamacpp_passkey.py), and a retrieval row that
keeps every trial's answer text."""

from __future__ import annotations

import json

import pytest
from test_model_tasks import HashTokenizer, case, tiny  # noqa: F401 - the fixture

from kvbench.engines import llamacpp as llama_engine
from kvbench.engines import model_tasks as engine
from kvbench.engines.contract import carrying
from kvbench.kernels.model import passkey
from kvbench.peers.llamacpp_passkey import parse_passkey, passkey_command

# examples/passkey/passkey.cpp (b11434), its literals copied by hand
CPP_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
CPP_JUNK = (
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)


def test_text_is_passkey_cpps():
    needle = " The pass key is 39384. Remember it. 39384 is the pass key."
    want = CPP_PREFIX + CPP_JUNK + needle + CPP_JUNK + CPP_JUNK
    assert passkey.text(3, 1) == want + " What is the pass key? The pass key is"
    assert passkey.text(2, 0).startswith(CPP_PREFIX + needle + CPP_JUNK)


@pytest.mark.parametrize("n,depth,trial,want", [(10, 0, 0, 0), (10, 1, 0, 9), (10, 0.5, 0, 5),
                                                (10, 0.94, 0, 9), (10, 0.9, 2, 1)])  # fmt: skip
def test_position(n, depth, trial, want):
    assert passkey.position(n, depth, trial) == want


class BosTokenizer(HashTokenizer):
    """A vocabulary that adds BOS (add_bos None: its own rule, as kvbench's TextTokenizer)."""

    def encode(self, text, add_bos=None):
        return ([1] if add_bos is not False else []) + super().encode(text)


def test_fit_and_prompt_in_tokens():
    tok = BosTokenizer()
    n = passkey.fit_junk(tok, 300)
    size = lambda k: len(tok.encode(passkey.text(k, 0)))  # noqa: E731
    assert size(n) + 16 <= 300 < size(n + 1) + 16  # the most repetitions that fit
    p = passkey.prompt(tok, 300, 0.5)
    assert p.tokens == tok.encode(passkey.text(n, round(0.5 * n))) and p.tokens[0] == 1
    # a vocabulary without BOS gets none (SmolLM2's GGUF: llama-passkey counts no BOS)
    assert passkey.prompt(HashTokenizer(), 300, 0.5).tokens[0] != 1
    assert p.units == n and p.answer == "39384" and p.gen_tokens == 16
    assert tok.decode(p.tokens[p.needle_at : p.needle_at + 5]) == "The pass key is 39384."
    with pytest.raises(ValueError, match="no room"):
        passkey.fit_junk(tok, 60)


STDERR = """main: n_len = 2000, n_ctx = 8416, n_kv_req = 8448, n_grp = 1, n_batch = 2048
prefix tokens: 29
prompt tokens: 1984
main: passkey = 39384, inserted at position 8 / 80 (token pos: ~198)
"""


class CountingTokenizer(BosTokenizer):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def encode(self, text, add_bos=None):
        self.calls += 1
        return super().encode(text, add_bos)


def test_a_suites_rows_share_their_prompts_validation(monkeypatch):
    # used to: every row searched n_junk again (about 20 whole-prompt tokenizations a row):
    # suites/passkey-llamacpp.yaml's 180 rows took ~6.5 min to validate
    from kvbench.kernels.model import retrieval

    tok = CountingTokenizer()
    monkeypatch.setitem(retrieval._TOKENIZERS, "counted-passkey", (tok, {}))
    sizes = passkey.prompt_sizes("counted-passkey", 600, 0.5, 2)
    first = tok.calls
    n = passkey.fit_junk(tok, 600)
    assert sizes == [len(tok.encode(passkey.text(n, passkey.position(n, 0.5, i)))) for i in (0, 1)]
    tok.calls = first
    for _ in range(9):  # the other formats' and the other kernel's rows of the same prompt
        assert passkey.prompt_sizes("counted-passkey", 600, 0.5, 2) == sizes
    assert tok.calls == first
    # another depth at the same length: no new search, 4 tokenizations a trial (the prompt, the
    # text before the needle, the instruction, the question)
    passkey.prompt_sizes("counted-passkey", 600, 0.1, 1)
    assert tok.calls == first + 4


def test_parse_and_command():
    got = parse_passkey(" 39384. The grass is green. The sky is blue\n\n\n", STDERR)
    assert got == {"answer_text": " 39384. The grass is green. The sky is blue", "key": "39384",
                   "i_pos": 8, "n_junk": 80, "prompt_tokens": 1984, "decode_tokens": None,
                   "decode_s": None, "n_ctx": 8416, "n_kv_req": 8448, "n_grp": 1,
                   "n_batch": 2048, "shifts": [], "swa_full": False}  # fmt: skip
    # its own clock of the answer (examples/passkey/passkey.cpp's closing line)
    timed = parse_passkey("", STDERR + "main: decoded 15 tokens in 0.60 s, speed: 25.00 t/s\n")
    assert (timed["decode_tokens"], timed["decode_s"]) == (15, 0.6)
    cmd = passkey_command("lp", "m.gguf", n_junk=80, i_pos=8, type_k="q4_0", type_v="q4_0")
    assert cmd[1:] == ["-m", "m.gguf", "--junk", "80", "--pos", "8", "-ctk", "q4_0", "-ctv",
                       "q4_0", "-fa", "1", "-t", "1"]  # fmt: skip
    # a context shift / self-extend: --keep, -b, --grp-attn-n and the trained length overridden
    cmd = passkey_command("lp", "m.gguf", n_junk=30, i_pos=3, keep=29, n_batch=240,
                          grp_attn_n=2, ctx_train=("llama", 256))  # fmt: skip
    assert cmd[-8:] == ["--keep", "29", "-b", "240", "--grp-attn-n", "2", "--override-kv",
                        "llama.context_length=int:256"]  # fmt: skip
    # sliding-window layers that keep every cell: --swa-full, and its warning read back
    cmd = passkey_command("lp", "m.gguf", n_junk=30, i_pos=3, grp_attn_n=2, swa_full=True)
    assert cmd[-3:] == ["--grp-attn-n", "2", "--swa-full"]
    warned = "llama_kv_cache_iswa: using full-size SWA cache (ref: https://github.com/...)\n"
    assert parse_passkey("", warned + STDERR)["swa_full"] is True


# llama-passkey's log of a run with its context shift (b11434 on SmolLM2, --override-kv
# llama.context_length=int:256 --keep 32 -b 240: 784 prompt tokens through 480 positions)
SHIFTED = """main: n_len = 800, n_ctx = 480, n_kv_req = 512, n_grp = 1, n_batch = 240, n_junk = 30
prompt tokens: 784
main: processed: [     0,    240)
main: processed: [   240,    480)
main: shifting KV cache with 240
main: processed: [   480,    720)
main: shifting KV cache with 240
main: processed: [   720,    784)
main: passkey = 39384, inserted at position 3 / 30 (token pos: ~78)
"""


def test_parse_a_shifted_run():
    got = parse_passkey(" a password", SHIFTED)
    assert got["shifts"] == [240, 240] and (got["n_ctx"], got["n_kv_req"]) == (480, 512)
    assert (got["n_grp"], got["n_batch"]) == (1, 240)


def test_passkey_cost_by_hand():
    runs = [
        {"wall_s": 3.0, "prompt_tokens": 1984, "decode_tokens": 15, "decode_s": 0.6},
        {"wall_s": 2.0, "prompt_tokens": 1990, "decode_tokens": 5, "decode_s": 0.2},
    ]
    got = llama_engine.passkey_cost(runs)
    assert got["wall_s"] == 5.0 and got["prefill_tokens"] == 3974
    assert got["decode_tokens"] == 20 and got["decode_tokens_per_s"] == pytest.approx(20 / 0.8)
    untimed = llama_engine.passkey_cost([{**runs[0], "decode_tokens": None, "decode_s": None}])
    assert untimed["decode_s"] is None and untimed["decode_tokens_per_s"] is None


def test_llamacpp_engine_runs_only_this_retrieval_task():
    c = case(phase="retrieval", task="passkey", kernel="llama.cpp", kv_dtype="fp16")
    assert "passkey-llamacpp only" in llama_engine.skip_reason(c, "cpu")


def test_retrieval_rows_keep_every_answer_text(tiny):  # noqa: F811 - the fixture
    c = case(phase="retrieval", task=passkey.TASK, trials=2, depth=0.5, context_len=120)
    row = carrying(engine.build)(c).check()
    texts = json.loads(row["answer_texts"])
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    assert row["n_trials"] == 2 and row["n_ref_agree"] == 2  # the float32 cache against itself
