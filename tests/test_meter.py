"""What a model phase's evidence cost (kernels/model/meter.py), llama.cpp's own timings
(peers/llamacpp_perplexity.py perf_info) and the row columns they fill (store/schema.py)."""

from __future__ import annotations

import pytest

from kvbench.engines.llamacpp import cost_fields
from kvbench.kernels.model import meter
from kvbench.peers.llamacpp_perplexity import pass_info, perf_info, setup_info
from kvbench.store.schema import COLUMNS


def test_a_pass_is_credited_to_every_open_meter_and_no_closed_one():
    meter.add("prefill", 5, 1.0)  # no meter open: credited to none
    with meter.metered() as outer:
        meter.add("prefill", 8, 0.5)
        with meter.metered() as inner:
            meter.add("decode", 1, 0.25)
            meter.add("decode", 1, 0.25)
        meter.add("prefill", 4, 0.5)
    meter.add("decode", 3, 1.0)  # after both closed
    f, g = outer.fields(), inner.fields()
    assert (f["prefill_tokens"], f["prefill_s"], f["prefill_tokens_per_s"]) == (12, 1.0, 12.0)
    assert (f["decode_tokens"], f["decode_s"], f["decode_tokens_per_s"]) == (2, 0.5, 4.0)
    assert (g["prefill_tokens"], g["prefill_s"], g["prefill_tokens_per_s"]) == (0, None, None)
    assert g["decode_tokens"] == 2 and 0 <= g["wall_s"] <= f["wall_s"]


def test_an_unknown_pass_kind_is_refused():
    with pytest.raises(ValueError, match="unknown pass kind 'eval'"):
        meter.add("eval", 1, 0.1)


def test_the_meter_fields_are_record_columns():
    with meter.metered() as m:
        pass
    assert set(m.fields()) | {"ref_wall_s"} <= set(COLUMNS)


# the closing lines of llama-perplexity, as llama_perf_context_print formats them (b11434)
PERF_LOG = """\
llama_perf_context_print:        load time =     312.45 ms
llama_perf_context_print: prompt eval time =   21874.10 ms /  4096 tokens (    5.34 ms per token,   187.25 tokens per second)
llama_perf_context_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
llama_perf_context_print:       total time =   23950.99 ms /  4097 tokens
"""  # noqa: E501


def test_llama_cpp_timings_by_hand():
    got = perf_info(PERF_LOG)
    assert got == {"prefill_s": 21.8741, "prefill_tokens": 4096, "decode_s": 0.0,
                   "decode_tokens": 1}  # fmt: skip
    assert perf_info("no timings here") == {}


def test_llama_cpp_cost_fields():
    row = cost_fields({"wall_s": 24.5, **perf_info(PERF_LOG)})
    assert row["wall_s"] == 24.5 and row["prefill_tokens_per_s"] == pytest.approx(4096 / 21.8741)
    assert row["decode_tokens"] == 1 and row["decode_tokens_per_s"] is None  # 0 ms: no rate
    assert set(row) <= set(COLUMNS)
    assert cost_fields({"wall_s": 3.0})["prefill_s"] is None


# llama-perplexity at its default verbosity (b11434, SmolLM2, -c 128 --chunks 1): the setup line
# and its own clock of the first pass, run into the next log line as it prints them
PASS_LOG = """\
0.15.814.749 I perplexity: calculating perplexity over 1 chunks, n_ctx=128, batch_size=2048, n_seq=16
0.33.928.702 I perplexity: 18.11 seconds per pass - ETA 0.34.031.399 I Final estimate: PPL = 6.4009 +/- 2.15434
"""  # noqa: E501


def test_llama_cpp_first_pass_by_hand():
    """The pass it times holds min(n_seq, n_chunks) chunks of n_ctx tokens: 1 x 128 here."""
    setup = setup_info(PASS_LOG)
    assert pass_info(PASS_LOG, setup) == {"prefill_s": 18.11, "prefill_tokens": 128}
    two = PASS_LOG.replace("over 1 chunks, n_ctx=128", "over 40 chunks, n_ctx=512")
    two = two.replace("n_seq=16", "n_seq=4")
    assert pass_info(two, setup_info(two))["prefill_tokens"] == 4 * 512
    assert pass_info("no pass here", setup) == {} and pass_info(PASS_LOG, {}) == {}
    row = cost_fields({"wall_s": 30.0, **pass_info(PASS_LOG, setup)})
    assert row["prefill_tokens_per_s"] == pytest.approx(128 / 18.11)
