"""`model:` beyond the registered preset (kernels/model/source.py, harness/suite): a GGUF file, an
mlx-lm directory, a Hugging Face repo id from the local cache; the shape axes read from the
model's metadata; bad input (missing path, directory without config.json, unknown
architecture, GGUF of an unknown arch, context past the trained length, an unreachable hub)
as one line and exit 2 from the CLI."""

from __future__ import annotations

import json

import pytest
from tiny_model import weights, write_gguf_writer, write_mlx_dir

from kvbench.cli import main
from kvbench.errors import SuiteError
from kvbench.kernels.model import source
from kvbench.kernels.model.load import ModelError
from kvbench.store.checks import dir_files
from kvbench.suite.suite import resolve

QUALITY = {"phase": "quality", "context_len": 32, "kv_dtype": "int8", "kernel": "reference"}


@pytest.fixture()
def gguf(tmp_path):
    return write_gguf_writer(tmp_path / "tiny.gguf", weights(seed=1), context_len=256)


def test_a_gguf_path_gives_the_shape_axes(gguf):
    case = resolve("s.yaml", {**QUALITY, "model": str(gguf)})
    assert (case.n_layers, case.n_q_heads, case.n_kv_heads, case.head_dim) == (2, 4, 2, 64)
    assert case.model == str(gguf)


def test_an_mlx_dir_gives_the_shape_axes(tmp_path):
    d = write_mlx_dir(tmp_path / "dir", weights(seed=3))
    case = resolve("s.yaml", {**QUALITY, "model": str(d)})
    assert (case.n_layers, case.n_kv_heads, case.head_dim) == (2, 2, 64)


def fake_hf_cache(root, repo: str, src) -> None:
    """The layout huggingface_hub keeps: models--org--name/{refs/main, snapshots/<commit>/}."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for f in src.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("0123abcd")


def test_a_repo_id_resolves_from_the_local_hf_cache(tmp_path, monkeypatch):
    d = write_mlx_dir(tmp_path / "dir", weights(seed=3))
    fake_hf_cache(tmp_path / "hub", "kvbench-test/tiny-llama", d)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    path = source.model_file("kvbench-test/tiny-llama")
    assert (path / "config.json").is_file() and path.name == "0123abcd"


def test_a_repo_id_neither_cached_nor_reachable_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="not in the local Hugging Face cache") as e:
        source.model_file("kvbench-test/not-there")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: p / "missing.gguf", "no such file"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "needs config.json"),
        (lambda p: write_gguf_writer(p / "b.gguf", weights(seed=1), arch="bert"), "'bert'"),
    ],
)  # fmt: skip
def test_bad_models_refuse_the_suite_in_one_line(tmp_path, make, match):
    with pytest.raises(SuiteError, match=match):
        resolve("s.yaml", {**QUALITY, "model": str(make(tmp_path))})


def test_unknown_architecture_in_config(tmp_path):
    d = write_mlx_dir(tmp_path / "dir", weights(seed=3))
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_arch"}))
    with pytest.raises(SuiteError, match="mlx-lm has no such architecture"):
        resolve("s.yaml", {**QUALITY, "model": str(d)})


def test_context_past_the_trained_length_only_when_asked(gguf):
    with pytest.raises(SuiteError, match="past .* trained length 256.*context_limit: beyond"):
        resolve("s.yaml", {**QUALITY, "model": str(gguf), "context_len": 512})
    case = resolve("s.yaml", {**QUALITY, "model": str(gguf), "context_len": 512,
                               "context_limit": "beyond"})  # fmt: skip
    assert case.context_limit == "beyond"


def test_a_shape_preset_is_not_a_real_model():
    with pytest.raises(SuiteError, match="runs a real model"):
        resolve("s.yaml", {**QUALITY, "model": "llama-3-8b"})


def test_the_cli_refuses_a_missing_model_in_one_line(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    missing = tmp_path / "nope.gguf"
    suite.write_text(
        "name: s\nfixed: {phase: quality, context_len: 32, kernel: reference, "
        f"model: {missing}}}\nsweep: {{kv_dtype: [int8]}}\n"
    )
    rc = main(["run", str(suite), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and "Traceback" not in err, err
    assert "nope.gguf" in lines[-1] and "no such file" in lines[-1], lines[-1]


def test_a_model_phase_with_no_kernel_runs_each_formats_reference_path():
    """Issue #24: a quality sweep with no kernel skipped every quantized format ("kernel sdpa:
    needs a dense cache, int8 is quantized"); now the reference path runs, and model_decode
    gets a kernel that reads the format (tiled over packed data, sdpa over a dense cache)."""
    from kvbench.engines import model as engine

    base = {"model": "smollm2-135m", "context_len": 64}
    q = resolve("s.yaml", {**base, "phase": "quality", "kv_dtype": "int8"})
    assert q.kernel == "reference" and engine.skip_reason(q, "cpu") is None
    d = resolve("s.yaml", {**base, "phase": "model_decode", "kv_dtype": "int4"})
    assert d.kernel == "tiled" and engine.skip_reason(d, "cpu") is None
    d16 = resolve("s.yaml", {**base, "phase": "model_decode", "kv_dtype": "fp16"})
    assert d16.kernel == "sdpa"
    named = resolve("s.yaml", {**base, "phase": "quality", "kv_dtype": "fp16", "kernel": "ops"})
    assert named.kernel == "ops"  # a kernel the suite names is kept


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_a_users_model_directory_runs_the_model_phases_end_to_end(tmp_path, arch):
    """A tiny mlx-lm directory with its own tokenizer.json, given as `model:`, through the CLI:
    quality (no kernel: the reference path) and model_decode rows, all ok."""
    from tiny_model import write_random_mlx_dir, write_tokenizer_json

    from kvbench.store.results import read_rows

    d = write_tokenizer_json(write_random_mlx_dir(tmp_path / arch, arch, n_layers=4))
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: s\nsettings: {warmup_s: 0, min_samples: 1, max_samples: 1, budget_s: 0.1, "
        f"rounds: 1}}\nfixed: {{model: {d}, context_len: 32}}\n"
        "zip:\n  - phase: [quality, quality, model_decode]\n    kv_dtype: [int8, fp16, int4]\n"
    )
    assert main(["run", str(suite), "--out", str(tmp_path / "out")]) == 0
    rows = read_rows(dir_files(tmp_path / "out")[0])
    assert list(rows["status"]) == ["ok"] * 3, rows[["status", "error"]]
    assert list(rows["kernel"]) == ["reference", "reference", "tiled"]
    q = rows[rows["phase"] == "quality"].set_index("kv_dtype")
    assert q.loc["fp16", "kl_mean"] < q.loc["int8", "kl_mean"] < 1  # a sane order
    assert q.loc["int8", "n_scored"] == 15
    # a quality row times nothing, so it has no peak (it printed 0); model_decode has one
    assert q["peak_mem_bytes"].isna().all()
    assert rows.loc[rows["phase"] == "model_decode", "peak_mem_bytes"].iloc[0] > 0


def test_plan_takes_a_model_file(gguf):
    from kvbench.errors import UserError
    from kvbench.suite.plan import resolve_shape

    s = resolve_shape(str(gguf), None, None, None)
    assert (s.n_layers, s.n_kv_heads, s.head_dim) == (2, 2, 64)
    with pytest.raises(UserError, match="unknown preset 'llama-9'"):
        resolve_shape("llama-9", None, None, None)
    with pytest.raises(UserError, match="no such file"):
        resolve_shape(str(gguf.parent / "nope.gguf"), None, None, None)


def test_gguf_rope_scaling_is_mapped_or_refused(tmp_path):
    import gguf

    from kvbench.kernels.model.load import gguf_config, gguf_metadata

    path = write_gguf_writer(tmp_path / "m.gguf", weights())
    reader = gguf.GGUFReader(str(path))
    md, names = gguf_metadata(reader), [t.name for t in reader.tensors]
    assert "rope_scaling" not in gguf_config(md, names, path)
    linear = {**md, "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 8.0}
    assert gguf_config(linear, names, path)["rope_scaling"] == {"type": "linear", "factor": 8.0}
    # current GGUFs write rope.scaling.*: a type kvbench does not map is refused, not dropped
    yarn = {**md, "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    with pytest.raises(ModelError, match="rope.scaling.type yarn is not mapped"):
        gguf_config(yarn, names, path)


def test_a_suites_validation_parses_a_gguf_once(gguf, monkeypatch):
    # used to: the model's shape and the retrieval prompts' tokenizer each parsed the whole file
    # (Gemma-3's vocabulary: 94 s each on a loaded 2-core CPU)
    import gguf as gguf_lib

    from kvbench.kernels.model import retrieval

    made, real = [], gguf_lib.GGUFReader
    monkeypatch.setattr(gguf_lib, "GGUFReader", lambda p, *a, **k: made.append(p) or real(p))
    shape = source.model_shape(str(gguf))
    with pytest.raises(ModelError):  # the tiny GGUF holds no vocabulary: read, then refused
        retrieval.tokenizer_of(str(gguf))
    source.model_shape.cache_clear()
    assert source.model_shape(str(gguf)) == shape  # a second validation in the same process
    assert made == [str(gguf)]
