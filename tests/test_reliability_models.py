"""Issue 35, reliability of the model phases: no row claims what it did not measure, and nothing
in a model's files crashes, hangs or tracebacks. One test (or table) per class of failure the
probe found (scripts/probe_models.py feeds the whole set), each failing before its fix. Models
are the tiny ones of tests/tiny_model.py, written per test."""

from __future__ import annotations

import pytest
from test_fault_inputs import one_line_error
from tiny_model import weights, write_gguf_writer

from kvbench.errors import SuiteError
from kvbench.store.checks import dir_files
from kvbench.suite.suite import resolve

QUALITY = {"phase": "quality", "context_len": 32, "kv_dtype": "int8", "kernel": "reference"}


@pytest.fixture()
def gguf(tmp_path):
    return write_gguf_writer(tmp_path / "tiny.gguf", weights(seed=1), context_len=256)


# ---- a: a real model's shape is its metadata's, never a suite's override ----------------------

SHAPE_OVERRIDES = {"n_layers": 1, "head_dim": 128, "n_q_heads": 8, "n_kv_heads": 1, "gqa_ratio": 4}


@pytest.mark.parametrize("axis", SHAPE_OVERRIDES)
def test_a_shape_axis_beside_a_real_model_is_refused(gguf, axis):
    # used to: the row said n_layers 1 / head_dim 128 while the 2-layer head_dim-64 model ran
    with pytest.raises(SuiteError, match=f"{axis}: .*metadata") as e:
        resolve("s.yaml", {**QUALITY, "model": str(gguf), axis: SHAPE_OVERRIDES[axis]})
    assert str(gguf) in str(e.value)


def test_a_registered_model_in_a_model_phase_takes_no_shape_axes_either():
    with pytest.raises(SuiteError, match="n_layers: .*metadata"):
        resolve("s.yaml", {**QUALITY, "model": "smollm2-135m", "n_layers": 2})
    # a synthetic phase on the preset's shape may still cut it down (suites/rotation.yaml)
    case = resolve("s.yaml", {"model": "smollm2-135m", "context_len": 64, "n_layers": 4})
    assert case.n_layers == 4


def test_the_format_checks_use_the_real_head_dim(gguf):
    # head_dim 48 with q4_0 was refused as "not a multiple of 32" though the model's is 64
    with pytest.raises(SuiteError, match="head_dim: .*metadata.*64"):
        resolve("s.yaml", {**QUALITY, "model": str(gguf), "kv_dtype": "q4_0", "head_dim": 48})


def test_the_suite_cli_refuses_the_override_in_one_line(tmp_path, capsys, gguf):
    suite = tmp_path / "s.yaml"
    suite.write_text(f"fixed: {{model: {gguf}, phase: quality, context_len: 32, n_layers: 1}}\n")
    one_line_error(capsys, ["run", suite, "--dry-run"], f"{suite}: n_layers", "metadata")


def test_plan_refuses_a_shape_beside_a_real_model(capsys, gguf):
    one_line_error(capsys, ["plan", "--model", gguf, "--head-dim", "48", "--context", "64"],
                   "--head-dim", "metadata")  # fmt: skip


# ---- b: a cache setting that never takes effect is refused -----------------------------------

GENERATE = {"phase": "generate", "context_len": 32, "gen_tokens": 4, "kv_dtype": "int4"}


def test_a_quantized_kv_start_past_the_last_position_is_refused(gguf):
    # used to: an int4 row equal to the fp16 row to the last digit, saying bits_per_elem 4.25
    with pytest.raises(SuiteError, match="quantized_kv_start: 100000 .*never") as e:
        resolve("s.yaml", {**GENERATE, "model": str(gguf), "quantized_kv_start": 100000})
    assert "32 + 4 - 2 = 34" in str(e.value)
    with pytest.raises(SuiteError, match="quantized_kv_start: 35 "):
        resolve("s.yaml", {**GENERATE, "model": str(gguf), "quantized_kv_start": 35})
    resolve("s.yaml", {**GENERATE, "model": str(gguf), "quantized_kv_start": 34})


def test_the_last_start_accepted_still_switches_before_the_last_step(gguf):
    """The bound is exact: at start = context_len + gen_tokens - 2 the spec's cache attends in
    the last decode step; one more and it never would."""
    from kvbench.kernels.model import generate
    from kvbench.kernels.model.cache import CacheSpec
    from kvbench.kernels.model.load import load_model

    class Watched(generate.DeferredCache):
        def attend(self, layer, *args):
            if layer == 0:
                self.seen.append(self.switched)
            return super().attend(layer, *args)

    model = load_model(gguf)
    for start, late_steps in ((34, 1), (35, 0)):
        cache = Watched(CacheSpec("int4"), model.config, 36, start=start)
        cache.seen = []
        generate.free_run(model, cache, list(range(1, 33)), 4)
        assert sum(cache.seen[1:]) == late_steps  # seen[0]: the prefill; then one a step


# ---- c: non-finite figures are error rows; import checks what it writes; readers skip aloud -----


def nan_model_dir(tmp_path):
    """A tiny mlx-lm directory (its own tokenizer) with one NaN in a key projection: every
    logit after the first layer is NaN, as a broken format or kernel would make them."""
    import mlx.core as mx
    from tiny_model import write_random_mlx_dir, write_tokenizer_json

    d = write_tokenizer_json(write_random_mlx_dir(tmp_path / "nan", "llama"))
    w = mx.load(str(d / "model.safetensors"))
    key = "model.layers.0.self_attn.k_proj.weight"
    w[key] = mx.where(mx.arange(w[key].size).reshape(w[key].shape) == 0, mx.nan, w[key])
    mx.save_safetensors(str(d / "model.safetensors"), w)
    return d


def test_non_finite_logits_make_error_rows_not_ok_rows(tmp_path):
    from kvbench.cli import main
    from kvbench.store.results import read_rows

    d = nan_model_dir(tmp_path)
    suite = tmp_path / "s.yaml"
    suite.write_text(
        f"fixed: {{model: {d}, context_len: 32, kv_dtype: int8}}\n"
        "zip: [{phase: [quality, generate], gen_tokens: [32, 2]}]\n"
    )
    # used to: ok rows with empty ppl and kl and top1_agree 1.0, exit 0
    assert main(["run", str(suite), "--out", str(tmp_path / "out")]) == 0
    rows = read_rows(dir_files(tmp_path / "out")[0])
    assert list(rows["status"]) == ["error", "error"], rows[["status", "error"]]
    for error in rows["error"]:
        assert "non-finite logits with the float32 cache" in error and "nan" in error, error


def test_a_non_finite_figure_of_any_check_is_an_error(monkeypatch):
    from kvbench.run import runner

    assert runner.finite_figures({"kl_mean": 0.1, "n_scored": 3, "kl_pos1": None}) is not None
    with pytest.raises(ValueError, match="kl_p99 is inf"):
        runner.finite_figures({"kl_mean": 0.1, "kl_p99": float("inf")})
    with pytest.raises(ValueError, match="sample 2 of stage step is nan"):
        runner.finite_samples("step", [1.0, 2.0, float("nan")])


def test_import_checks_the_samples_in_milliseconds(tmp_path, capsys):
    import copy
    import json

    from test_fault_inputs import DOC

    doc = copy.deepcopy(DOC)
    doc["benchmarks"][0]["stats"]["data"][0] = 1e308  # seconds: finite; in ms: inf
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    one_line_error(capsys, ["import", path, "--out", tmp_path / "out"],
                   "benchmarks[0].stats.data[0]", "ms")  # fmt: skip
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def _edit(path, row: int, col: str, value: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[row].rstrip("\n").split(",")
    cells[header.index(col)] = value
    lines[row] = ",".join(cells) + "\n"
    path.write_text("".join(lines))


READERS = {
    "compare": lambda d, out: ["compare", d, d],
    "history": lambda d, out: ["history", d],
    "report": lambda d, out: ["report", d, "-o", out / "r.html"],
    "merge": lambda d, out: ["merge", d, "-o", out / "merged"],
}


@pytest.mark.parametrize("reader", READERS)
def test_rows_without_a_case_id_or_a_known_status_are_skipped_aloud(tmp_path, capsys, reader):
    from fake_runs import draw, write_run

    from kvbench.cli import main

    d = tmp_path / "d"
    d.mkdir()
    cases = {f"c{i}": draw(10, 1.0 + i, seed=i) for i in range(3)}
    run = write_run(d, "r1", cases)
    _edit(run, 1, "case_id", "")  # data row 1
    _edit(run, 2, "status", "bogus")  # data row 2
    # used to: both rows silently dropped (history) or miscounted (report), no word said
    assert main([str(a) for a in READERS[reader](d, tmp_path)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if str(run) in line]
    assert len(warned) == 1 and warned[0].startswith("kvbench: warning: "), err
    assert "skipped 2 rows" in warned[0] and "data row 1: no case_id" in warned[0]
    assert "data row 2: status 'bogus'" in warned[0]


# ---- d: what a model phase allocates goes through the memory guard; counts are bounded --------

BOUNDS = {"trials": 1_000_000_000, "gen_tokens": 1_000_000_000, "chunks": 1_000_000_000}


@pytest.mark.parametrize("axis", BOUNDS)
def test_counts_a_run_multiplies_have_an_upper_bound(axis):
    # used to: trials 1e9 built 1e9 prompts before the first answer; gen_tokens 1e9 segfaulted
    with pytest.raises(SuiteError, match=f"{axis}: must be a positive integer of at most"):
        from kvbench.suite.validate import check_axis

        check_axis("s.yaml", axis, axis, BOUNDS[axis])


def test_a_model_phase_plans_its_reference_cache_and_its_whole_capacity(gguf):
    from kvbench.run import memory

    case = resolve("s.yaml", {**GENERATE, "kv_dtype": "fp16", "model": str(gguf)})
    plan = memory.case_plan(case)
    # 36 positions (32 + 4 generated) x 2 layers x (K, V) x 2 heads x 64, by hand:
    assert plan["cache"] == 36 * 2 * 2 * 2 * 64 * 2  # fp16: 36,864 B
    assert plan["reference"] == 36 * 2 * 2 * 2 * 64 * 4  # the float32 reference cache
    assert plan["scores"] == 4 * 36 * 36 * 4 * 2  # 4 q heads x 36 queries x 36 keys, fp32, x2
    assert plan["logits"] == 1 * 4 * 300 * 4 * 2  # 1 chunk x 4 steps x 300 vocab, ref + own
    assert plan["total"] == sum(v for k, v in plan.items() if k != "total")
    why = memory.refusal(case, (100_000, "a test's figure"))
    assert why.startswith(f"needs ~{plan['total']:,} B (cache 36,864 + reference 73,728")
    assert memory.refusal(case, (10**9, "a test's figure")) is None


def test_a_generate_case_too_big_for_memory_is_a_skipped_row(tmp_path, monkeypatch, gguf):
    from kvbench.cli import main
    from kvbench.run import memory
    from kvbench.store.results import read_rows

    # used to: gen_tokens 1e9 segfaulted in prefill (the float32 reference of 1e9 positions)
    monkeypatch.setattr(memory, "available_bytes", lambda: (50_000_000, "a test's figure"))
    suite = tmp_path / "s.yaml"
    suite.write_text(f"fixed: {{model: {gguf}, phase: generate, context_len: 32, "
                     "gen_tokens: 65536, context_limit: beyond}\n")  # fmt: skip
    assert main(["run", str(suite), "--out", str(tmp_path / "out")]) == 0
    rows = read_rows(dir_files(tmp_path / "out")[0])
    assert list(rows["status"]) == ["skipped"]
    assert "reference" in rows["error"][0] and "50,000,000 B available" in rows["error"][0]


def test_the_dry_run_counts_the_forward_passes_of_the_model_phases(tmp_path, capsys, gguf):
    from kvbench.cli import main

    suite = tmp_path / "s.yaml"
    suite.write_text(f"fixed: {{model: {gguf}, phase: generate, context_len: 32, chunks: 2, "
                     "gen_tokens: 10}\n")  # fmt: skip
    assert main(["run", str(suite), "--dry-run"]) == 0
    # 2 chunks x 2 runs (free, teacher-forced) x (1 prefill piece + 10 steps) = 44
    assert "at least 44 forward passes of the model" in capsys.readouterr().out


# ---- e: a named pipe is refused wherever kvbench opens a path, before it is opened -------------


def _kvbench(args, env=None, timeout=120):
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "kvbench", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip


def _fifo(path):
    import os

    os.mkfifo(path)
    return path


def test_named_pipes_as_inputs_are_refused_not_waited_on(tmp_path):
    from fake_runs import draw, write_run

    pipe = _fifo(tmp_path / "pipe.gguf")
    model_dir = tmp_path / "dir"
    model_dir.mkdir()
    _fifo(model_dir / "config.json")
    runs = tmp_path / "runs"
    runs.mkdir()
    write_run(runs, "r1", {"c1": draw(10, 1.0, seed=1)})
    _fifo(runs / "r2.csv")
    suite = tmp_path / "s.yaml"
    suite.write_text(f"fixed: {{model: {pipe}, phase: quality, context_len: 32}}\n")
    suite2 = tmp_path / "s2.yaml"
    suite2.write_text(f"fixed: {{model: {model_dir}, phase: quality, context_len: 32}}\n")
    json_pipe = _fifo(tmp_path / "b.json")
    refused = {  # used to: each of these blocked for ever on open()
        "plan --model": (["plan", "--model", pipe, "--context", "64"], f"{pipe}: a named pipe"),
        "run model:": (["run", suite, "--dry-run"], f"{pipe}: a named pipe"),
        "config.json": (["run", suite2, "--dry-run"], "config.json: a named pipe"),
        "compare FILE": (["compare", runs / "r2.csv", runs / "r1.csv"], "r2.csv: a named pipe"),
        "import": (["import", json_pipe, "--out", tmp_path / "o"], "b.json: a named pipe"),
    }
    for name, (argv, needle) in refused.items():
        done = _kvbench(argv, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (name, done.stderr)
        assert needle in done.stderr.strip().splitlines()[-1], (name, done.stderr)
    done = _kvbench(["history", runs], timeout=60)  # in a directory: skipped with a word
    assert done.returncode == 0 and "r2.csv: skipped: a named pipe" in done.stderr, done.stderr


def test_a_named_pipe_as_kvbench_blas_does_not_hang_help(tmp_path):
    pipe = _fifo(tmp_path / "libblas.so")
    done = _kvbench(["--help"], env={"KVBENCH_BLAS": str(pipe)}, timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout, done.stderr
    done = _kvbench(["env"], env={"KVBENCH_BLAS": str(pipe)}, timeout=60)
    assert done.returncode == 2 and "KVBENCH_BLAS" in done.stderr and "named pipe" in done.stderr


# ---- f: a model's config.json and GGUF metadata are data, checked before use ------------------


def _config_dir(tmp_path, text: bytes):
    from tiny_model import write_mlx_dir

    d = write_mlx_dir(tmp_path / "dir", weights(seed=3))
    (d / "config.json").write_bytes(text)
    return d


def _config(**change) -> bytes:
    import json

    from tiny_model import TINY

    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "vocab_size": TINY["vocab"], "intermediate_size": 192}  # fmt: skip
    cfg.update(change)
    return json.dumps({k: v for k, v in cfg.items() if v != "DROP"}).encode()


CONFIGS = {  # used to: TypeError, ZeroDivisionError or AttributeError tracebacks
    "null": (b"null", "-: not a JSON object (null)"),
    "a string": (b'"llama"', "-: not a JSON object (str)"),
    "a list": (b"[1, 2]", "-: not a JSON object (list)"),
    "binary": (bytes(range(256)), "unreadable"),
    "no num_attention_heads": (_config(num_attention_heads="DROP"), "num_attention_heads: missing"),
    "heads 0": (_config(num_attention_heads=0), "num_attention_heads: must be a positive integer"),
    "layers as text": (_config(num_hidden_layers="2"), "num_hidden_layers: must be a positive"),
    "head_dim 0": (_config(head_dim=0), "head_dim: must be a positive integer"),
    "vocab -1": (_config(vocab_size=-1), "vocab_size: must be a positive integer"),
    "kv heads 3 of 4": (_config(num_key_value_heads=3), "num_key_value_heads: 3 does not divide"),
    "rope NaN": (_config(rope_theta=float("nan")), "rope_theta: must be a positive finite"),
    "layers 1e12": (_config(num_hidden_layers=10**12), "num_hidden_layers: 1,000,000,000,000 is"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_a_bad_config_json_is_one_line_naming_file_and_key(tmp_path, capsys, name):
    from kvbench.kernels.model import source

    source.model_shape.cache_clear()
    text, needle = CONFIGS[name]
    d = _config_dir(tmp_path, text)
    suite = tmp_path / "s.yaml"
    suite.write_text(f"fixed: {{model: {d}, phase: quality, context_len: 32}}\n")
    one_line_error(capsys, ["run", suite, "--dry-run"], f"{d / 'config.json'}: ", needle)


def _meta_gguf(path, **fields):
    """A GGUF holding only metadata (the shape is read from it, no weights): TINY's llama
    fields, changed or dropped (None) by `fields` (keys after `llama.`)."""
    import gguf

    base = {"block_count": 2, "embedding_length": 128, "attention.head_count": 4,
            "attention.head_count_kv": 2, "context_length": 256, "vocab_size": 300}  # fmt: skip
    base.update(fields)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, v in base.items():
        if v is None:
            continue
        if isinstance(v, float):
            w.add_float32(f"llama.{key}", v)
        else:
            w.add_uint32(f"llama.{key}", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


GGUFS = {  # used to: ZeroDivisionError, or a dry run listing a case with head_dim 0
    "head_count 0": ({"attention.head_count": 0}, "llama.attention.head_count: must be"),
    "embedding_length 1": (
        {"embedding_length": 1},
        "llama.embedding_length: 1 / 4 heads gives head_dim 0",
    ),
    "block_count 0": ({"block_count": 0}, "llama.block_count: must be a positive integer"),
    "head_count_kv 0": ({"attention.head_count_kv": 0}, "llama.attention.head_count_kv: must"),
    "vocab_size 0": ({"vocab_size": 0}, "llama.vocab_size: must be a positive integer"),
    "freq_base NaN": ({"rope.freq_base": float("nan")}, "llama.rope.freq_base: must be a positive"),
}


@pytest.mark.parametrize("name", GGUFS)
def test_bad_gguf_metadata_is_one_line_naming_file_and_key(tmp_path, capsys, name):
    from kvbench.kernels.model import source

    source.model_shape.cache_clear()
    fields, needle = GGUFS[name]
    path = _meta_gguf(tmp_path / "m.gguf", **fields)
    suite = tmp_path / "s.yaml"
    suite.write_text(f"fixed: {{model: {path}, phase: quality, context_len: 32, kv_dtype: fp16}}\n")
    one_line_error(capsys, ["run", suite, "--dry-run"], f"{path}: ", needle)
    one_line_error(capsys, ["plan", "--model", path, "--context", "64"], f"{path}: ", needle)


def test_a_good_metadata_gguf_still_gives_its_shape(tmp_path):
    from kvbench.kernels.model import source

    path = _meta_gguf(tmp_path / "m.gguf")
    s = source.model_shape(str(path))
    assert (s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.vocab) == (2, 4, 2, 32, 300)


# ---- g: what is knowable before the weights load is checked at validation ----------------------


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A tiny mlx-lm directory with its own tokenizer.json (retrieval builds its prompts)."""
    from tiny_model import write_random_mlx_dir, write_tokenizer_json

    d = tmp_path_factory.mktemp("tok") / "llama"
    return write_tokenizer_json(write_random_mlx_dir(d, "llama"))


def test_v_format_is_checked_against_head_dim(tmp_path):
    # used to: validation passed, the model loaded, and the row was an error (exit 0)
    path = write_gguf_writer(tmp_path / "d48.gguf", weights(seed=1, head_dim=48))
    with pytest.raises(SuiteError, match="v_dtype: .*48"):
        resolve("s.yaml", {**QUALITY, "model": str(path), "kv_dtype": "fp16", "v_dtype": "q4_0"})


def test_a_retrieval_context_too_short_for_its_haystack_is_refused(tok_dir):
    case = {"phase": "retrieval", "task": "passkey", "model": str(tok_dir), "context_len": 16}
    with pytest.raises(SuiteError, match="context_len: .*leaves no room for a haystack"):
        resolve("s.yaml", case)
    resolve("s.yaml", {**case, "context_len": 256})  # room enough


@pytest.mark.parametrize("phase", ["generate", "quality"])
def test_a_context_too_short_to_chunk_is_refused(gguf, phase):
    # generate at context 2 loaded the model, then wrote an error row
    with pytest.raises(SuiteError, match="context_len: .*at least 4"):
        resolve("s.yaml", {**QUALITY, "phase": phase, "model": str(gguf), "context_len": 2})


def test_generate_needs_chunks_x_context_of_text(tmp_path, gguf):
    text = tmp_path / "t.txt"
    text.write_text("word " * 20)  # 100 bytes: at most 102 tokens
    with pytest.raises(SuiteError, match="needs context_len x chunks = 128"):
        resolve("s.yaml", {**GENERATE, "model": str(gguf), "text": str(text), "chunks": 4})


@pytest.mark.parametrize("axis, value", [("chunks", 2), ("text", "t.txt")])
def test_axes_retrieval_does_not_read_are_refused(tok_dir, axis, value):
    case = {"phase": "retrieval", "task": "passkey", "model": str(tok_dir), "context_len": 256}
    with pytest.raises(SuiteError, match=f"{axis}: only phases .* use it, not retrieval"):
        resolve("s.yaml", {**case, axis: value})


# ---- h: report -o checks its target like every other output ----------------------------------


@pytest.mark.parametrize("target", ["the run itself", "new.csv", "notes.txt", "a pipe"])
def test_report_o_checks_its_target(tmp_path, capsys, target):
    import os

    from fake_runs import draw, write_run

    d = tmp_path / "d"
    d.mkdir()
    run = write_run(d, "r1", {"c1": draw(10, 1.0, seed=1)})
    (tmp_path / "notes.txt").write_text("mine\n")
    out = {"the run itself": run, "new.csv": tmp_path / "new.csv",
           "notes.txt": tmp_path / "notes.txt", "a pipe": tmp_path / "pipe"}[target]  # fmt: skip
    if target == "a pipe":
        os.mkfifo(out)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    # used to: R.csv refused only because mkdir failed; new.csv became a directory
    one_line_error(capsys, ["report", run, "-o", out], f"{out}: -o: ")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "new.csv").exists()


def test_report_o_a_directory_is_still_a_site(tmp_path, capsys):
    from fake_runs import draw, write_run

    from kvbench.cli import main

    run = write_run(tmp_path, "r1", {"c1": draw(10, 1.0, seed=1)})
    assert main(["report", str(run), "-o", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "index.html").is_file()
