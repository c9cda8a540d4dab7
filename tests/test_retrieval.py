"""Retrieval tasks (kernels/model/retrieval.py): generator determinism, needle placement at the
requested depth in tokens, answer extraction and scoring, and the Wilson interval against hand
values and scipy; on the real SmolLM2 (when fetched) the float32 cache finds a short passkey."""

from __future__ import annotations

import pytest
from scipy.stats import binomtest

from kvbench.kernels.model import retrieval as R
from kvbench.stats import wilson


class WordTokenizer:
    """One token per whitespace-separated word (a line break is a word too): token counts of
    every piece are known by hand."""

    def __init__(self, add_bos: bool = False):
        self.vocab: dict[str, int] = {}
        self.add_bos = add_bos  # the vocabulary's own rule, as kvbench's TextTokenizer has it

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        words = text.replace("\n", " \n ").split(" ")
        ids = [self.vocab.setdefault(w, len(self.vocab)) for w in words if w]
        return ([-1] if (self.add_bos if add_bos is None else add_bos) else []) + ids

    def decode(self, ids: list[int]) -> str:
        inv = {v: k for k, v in self.vocab.items()}
        return " ".join(inv[i] for i in ids)


@pytest.mark.parametrize("task", sorted(R.TASKS))
def test_generators_are_deterministic_and_vary_by_seed(task):
    assert R.make_trial(task, 3) == R.make_trial(task, 3)
    answers = {R.make_trial(task, s).answer for s in range(8)}
    assert len(answers) == 8  # eight seeds, eight different truths
    t = R.make_trial(task, 0)
    assert all(part in t.needles[0] for part in t.answer.split()[:1])


def test_passkey_is_five_digits_and_niah_seven():
    for s in range(20):
        assert len(R.make_trial("passkey", s).answer) == 5
        assert len(R.make_trial("niah", s).answer) == 7
    m = R.make_trial("multikey", 1)
    assert len(m.needles) == 1 + R.N_DISTRACTORS and len(m.where) == R.N_DISTRACTORS
    assert all(m.answer not in n for n in m.needles[1:])  # distractors hold other numbers


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("task", ["passkey", "niah", "multikey"])
def test_needle_sits_at_the_requested_depth_in_tokens(task, depth):
    tok = WordTokenizer()
    trial = R.make_trial(task, 5)
    p = R.build_prompt(trial, tok, 2000, depth)
    needle = tok.encode(trial.needles[0])
    assert p.tokens[p.needle_at : p.needle_at + len(needle)] == needle
    unit = len(tok.encode(R.FILLER))  # 19 words and a line break
    assert unit == 20
    # filler tokens before the needle (less any distractor placed before it)
    slot = round(depth * p.units)
    early = [n for n, w in zip(trial.needles[1:], trial.where) if round(w * p.units) < slot]
    filler_before = p.needle_at - p.haystack[0] - sum(len(tok.encode(n)) for n in early)
    assert filler_before == slot * unit
    assert abs(filler_before / (p.units * unit) - depth) <= 0.5 / p.units + 1e-12
    # the budget: prompt + answer within context_len, and less than one unit short of it
    assert len(p.tokens) + trial.gen_tokens <= 2000 < len(p.tokens) + trial.gen_tokens + unit


def test_depth_by_hand_on_a_small_prompt():
    """passkey at 400 tokens, word tokenizer: head 1 (bos) + 27 words, tail 5 + 4 words,
    needle 13, answer 8: (400 - 28 - 9 - 13 - 8) // 20 = 17 units; depth 0.25 puts the
    needle after round(4.25) = 4 units, i.e. at token 28 + 4 * 20 = 108."""
    tok = WordTokenizer(add_bos=True)  # a vocabulary that adds BOS
    trial = R.make_trial("passkey", 0)
    assert len(tok.encode(trial.intro)) == 28 and len(tok.encode(trial.needles[0], False)) == 13
    p = R.build_prompt(trial, tok, 400, 0.25)
    assert p.units == 17 and p.needle_at == 108
    assert len(p.tokens) == 28 + 17 * 20 + 13 + 9


def test_vartrack_chain_in_order_after_its_first_line():
    tok = WordTokenizer()
    trial = R.make_trial("vartrack", 2)
    p = R.build_prompt(trial, tok, 1500, 0.3, seed=2)
    starts = [_find(p.tokens, tok.encode(line)) for line in trial.needles]
    assert starts[0] == p.needle_at and starts == sorted(starts)


def _find(hay: list[int], needle: list[int]) -> int:
    for i in range(len(hay) - len(needle) + 1):
        if hay[i : i + len(needle)] == needle:
            return i
    raise AssertionError("needle not found")


def test_too_short_a_context_is_one_clear_error():
    with pytest.raises(ValueError, match="no room for a haystack"):
        R.build_prompt(R.make_trial("niah", 0), WordTokenizer(), 60, 0.5)
    with pytest.raises(ValueError, match="depth"):
        R.build_prompt(R.make_trial("niah", 0), WordTokenizer(), 600, 1.5)
    with pytest.raises(ValueError, match="unknown retrieval task"):
        R.make_trial("haystack", 0)


def test_extraction_and_exact_match():
    assert R.extract("passkey", " 12345. Remember") == "12345"
    assert R.extract("niah", " is: 1234567.") == "1234567"
    assert R.extract("niah", " I do not know") is None
    assert R.correct("passkey", "12345", "12345") and not R.correct("passkey", "1234", "12345")
    assert not R.correct("passkey", "123456", "12345") and not R.correct("niah", None, "1")
    got = R.extract("vartrack", " ABCDE, FGHIJ, KLMNO, PQRST and UVWXY.")
    assert got == "ABCDE FGHIJ KLMNO PQRST UVWXY"
    assert R.correct("vartrack", got, "UVWXY ABCDE FGHIJ KLMNO PQRST")
    assert not R.correct("vartrack", "ABCDE FGHIJ", "ABCDE FGHIJ KLMNO")
    assert R.stop_early("passkey", " 12345.") and not R.stop_early("passkey", " 1234")
    assert not R.stop_early("vartrack", " 12345.")


def test_wilson_of_the_statistics_module_against_hand_values_and_scipy():
    # 12 of 20, z = 1.96: centre (0.6 + 3.8415/40) / 1.19207 = 0.58389,
    # half 1.96 * sqrt(0.012 + 0.0024009) / 1.19207 = 0.19731
    lo, hi = wilson(12, 20)
    assert lo == pytest.approx(0.3866, abs=2e-4) and hi == pytest.approx(0.7812, abs=2e-4)
    assert wilson(20, 20)[1] == 1.0 and wilson(20, 20)[0] == pytest.approx(0.8389, abs=2e-4)
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=2e-4))
    for k, n in [(0, 5), (3, 7), (12, 20), (19, 20), (50, 80)]:
        ci = binomtest(k, n).proportion_ci(method="wilson")
        assert wilson(k, n) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high))


def test_summary_columns_by_hand():
    truth = ["1", "2", "3", "4"]
    got = ["1", "2", None, "5"]
    ref = ["1", "2", "3", "5"]
    s = R.summarize("niah", got, ref, truth)
    assert s["n_trials"] == 4 and s["n_correct"] == 2 and s["accuracy"] == 0.5
    assert s["ref_accuracy"] == 0.75 and s["n_ref_agree"] == 3 and s["ref_agree"] == 0.75
    assert "accuracy_lo" not in s  # counts only: the interval is the instrument's (stats.wilson)


def test_chat_frame_from_a_gguf_template():
    template = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    before, after = R.chat_frame(WordTokenizer(), {"tokenizer.chat_template": template})
    assert before == "<|im_start|>user\n"
    assert after == "<|im_end|>\n<|im_start|>assistant\n"
    assert R.chat_frame(WordTokenizer(), {}) == ("", "")


def test_a_chat_template_prompt_gets_no_second_bos():
    tok = WordTokenizer(add_bos=True)
    trial = R.make_trial("passkey", 0)
    plain = R.build_prompt(trial, tok, 400, 0.5)
    chat = R.build_prompt(trial, tok, 400, 0.5, chat=("<s> user:\n", "\nassistant:\n"))
    assert plain.tokens[0] == -1 and -1 not in chat.tokens  # -1: WordTokenizer's BOS
    assert chat.tokens[0] == tok.encode("<s>", add_bos=False)[0]


def test_a_prompt_without_a_template_gets_bos_only_where_the_vocabulary_adds_one():
    # used to: a vocabulary that adds no BOS (SmolLM2's GGUF) still got one without a template
    from tokenizers import Tokenizer, models, pre_tokenizers

    from kvbench.kernels.model.tokenizer import TextTokenizer

    words = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    trial = R.make_trial("passkey", 0)
    for adds in (False, True):
        tok = TextTokenizer(words, bos_id=1, eos_id=None, add_bos=adds)
        prompt = R.build_prompt(trial, tok, 400, 0.5)
        assert prompt.tokens.count(1) == int(adds) and (prompt.tokens[0] == 1) == adds
        assert R.build_prompt(trial, WordTokenizer(adds), 400, 0.5).tokens.count(-1) == int(adds)


def test_chat_template_sees_the_gguf_bos_token():
    md = {
        "tokenizer.chat_template": "{{ bos_token }}{{ messages[0]['content'] }}|",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"],
        "tokenizer.ggml.bos_token_id": 1,
    }
    assert R.chat_frame(WordTokenizer(), md) == ("<s>", "|")


def test_greedy_answer_stops_at_the_end_of_turn(monkeypatch):
    """The greedy answer ends at an end-of-generation id and leaves it out of the text, as
    passkey.cpp (llama_vocab_is_eog) and kvpress's generate_answer (eos ids) do; before this
    it decoded gen_tokens tokens past the model's end of turn."""
    import mlx.core as mx
    from tokenizers import Tokenizer, models

    from kvbench.kernels.model import run
    from kvbench.kernels.model.tokenizer import TextTokenizer

    vocab = {"<|endoftext|>": 0, "a": 1, "<|im_end|>": 2, "b": 3}
    tok = TextTokenizer(Tokenizer(models.WordLevel(vocab, unk_token="a")), None, 2, False)
    tok.tok.add_special_tokens(["<|endoftext|>", "<|im_end|>"])
    said = iter([3, 1, 2, 3, 3])  # "b", "a", end of turn, then what must not be read
    monkeypatch.setattr(run, "prefill", lambda *a, **k: None)
    monkeypatch.setattr(run, "decode", lambda *a: mx.eye(4)[next(said)])
    prompt = R.Prompt([1, 1], 0, (0, 1), 1, "", gen_tokens=5)
    assert R.greedy_answer(None, None, tok, prompt, "vartrack") == "b a"
    assert next(said) == 3  # decoding stopped at the end of turn: one of the two left unread
