"""Probe (issue 35): feed the CLI bad model paths, phases, axes and outputs, as a new user would,
and count what comes back. Each input runs as its own `python -m kvbench` process with a time
limit; the tally:

* refused: exit 2 with one line `kvbench: ...` on stderr (no traceback) where a refusal is due;
* accepted: exit 0 where the input is valid (a run's ok rows then checked, below);
* wrongly refused / wrongly accepted: the other way round (named in the listing);
* traceback, crash (killed by a signal, exit >= 128), hang (over the limit), messy (exit 2 with
  more than one line): the failures the issue counts;
* false rows: ok rows of a run that claim what was not measured: a shape other than the model's
  metadata, a non-finite or missing quality / generate figure, a quantized_kv_start the cache
  never reached.

The models are tiny ones written here (tests/tiny_model.py: a 2-layer GGUF, an mlx-lm
directory with its own tokenizer, metadata-only GGUFs with one field changed); real runs are
few and small. Usage: `python scripts/probe_models.py [--jobs 2] [--list]`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tiny_model, fake_runs: the tests' own fixtures

DRY_S, RUN_S = 90, 600  # time limits: a dry run or refusal, a real (tiny) run


def write_fixtures(w: Path) -> dict:
    """Every file the probes name, under w."""
    import gguf
    from fake_runs import draw, write_run
    from tiny_model import weights, write_gguf_writer, write_random_mlx_dir, write_tokenizer_json

    f = {"gguf": write_gguf_writer(w / "tiny.gguf", weights(seed=1), context_len=256)}
    f["gguf48"] = write_gguf_writer(w / "d48.gguf", weights(seed=1, head_dim=48))
    f["dir"] = write_tokenizer_json(write_random_mlx_dir(w / "dir", "llama"))
    f["nan_dir"] = nan_dir(w)
    base = {"block_count": 2, "embedding_length": 128, "attention.head_count": 4,
            "attention.head_count_kv": 2, "context_length": 256, "vocab_size": 300}  # fmt: skip
    for name, change in META.items():
        fields = {**base, **change}
        path = w / f"meta-{name.replace(' ', '_')}.gguf"
        writer = gguf.GGUFWriter(str(path), fields.pop("arch", "llama"))
        for key, v in fields.items():
            if v is None:
                continue
            add = writer.add_float32 if isinstance(v, float) else writer.add_uint32
            add(f"{writer.arch}.{key}", v)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        f[f"meta:{name}"] = path
    good_cfg = json.loads((f["dir"] / "config.json").read_text())
    for name, text in CONFIGS.items():
        d = w / f"cfg-{len(f)}"
        d.mkdir()
        for src in f["dir"].iterdir():
            (d / src.name).symlink_to(src)
        (d / "config.json").unlink()
        body = text(good_cfg) if callable(text) else text
        (d / "config.json").write_bytes(body if isinstance(body, bytes) else body.encode())
        f[f"cfg:{name}"] = d
    for name in ("pipe.gguf", "pipe.csv", "pipe.json", "pipe.txt", "pipe.so", "pipe.out"):
        os.mkfifo(w / name)
    (w / "pipe-dir").mkdir()
    os.mkfifo(w / "pipe-dir" / "config.json")
    (w / "pipe-weights").mkdir()
    for src in f["dir"].iterdir():
        if src.suffix != ".safetensors":
            (w / "pipe-weights" / src.name).symlink_to(src)
    os.mkfifo(w / "pipe-weights" / "model.safetensors")
    (w / "empty.gguf").write_bytes(b"")
    (w / "junk.gguf").write_bytes(bytes(range(256)) * 64)
    (w / "text.gguf").write_text("not a model\n")
    (w / "dir.gguf").mkdir()
    (w / "nocfg").mkdir()
    (w / "loop.gguf").symlink_to(w / "loop.gguf")
    (w / "short.txt").write_text("word " * 20)
    (w / "notes.txt").write_text("mine\n")
    runs = w / "runs"
    runs.mkdir()
    f["run"] = write_run(runs, "r1", {f"c{i}": draw(10, 1.0 + i, seed=i) for i in range(3)})
    bad = w / "badrows"
    bad.mkdir()
    f["badrun"] = write_run(bad, "r1", {f"c{i}": draw(10, 1.0 + i, seed=i) for i in range(3)})
    lines = f["badrun"].read_text().splitlines(keepends=True)
    head = lines[0].rstrip("\n").split(",")
    for row, col, value in ((1, "case_id", ""), (2, "status", "bogus")):
        cells = lines[row].rstrip("\n").split(",")
        cells[head.index(col)] = value
        lines[row] = ",".join(cells) + "\n"
    f["badrun"].write_text("".join(lines))
    doc = json.loads((ROOT / "tests" / "data" / "pytest-benchmark.json").read_text())
    doc["benchmarks"][0]["stats"]["data"][0] = 1e308
    (w / "huge.json").write_text(json.dumps(doc))
    return f


def nan_dir(w: Path) -> Path:
    import mlx.core as mx
    from tiny_model import write_random_mlx_dir, write_tokenizer_json

    d = write_tokenizer_json(write_random_mlx_dir(w / "nan", "llama"))
    arrays = mx.load(str(d / "model.safetensors"))
    key = "model.layers.0.self_attn.k_proj.weight"
    a = arrays[key]
    arrays[key] = mx.where(mx.arange(a.size).reshape(a.shape) == 0, mx.nan, a)
    mx.save_safetensors(str(d / "model.safetensors"), arrays)
    return d


META = {  # metadata-only GGUFs: the shape is read from them, nothing loads
    "head_count 0": {"attention.head_count": 0}, "head_count_kv 0": {"attention.head_count_kv": 0},
    "head_count_kv 3": {"attention.head_count_kv": 3}, "block_count 0": {"block_count": 0},
    "embedding_length 1": {"embedding_length": 1}, "vocab_size 0": {"vocab_size": 0},
    "freq_base nan": {"rope.freq_base": float("nan")},
    "freq_base -1": {"rope.freq_base": -1.0}, "no block_count": {"block_count": None},
    "no head_count": {"attention.head_count": None}, "arch bert": {"arch": "bert"},
    "context_length 0": {"context_length": 0},
}  # fmt: skip
CONFIGS = {
    "null": "null", "a string": '"llama"', "a list": "[1, 2]", "a number": "7",
    "binary": bytes(range(256)), "empty": "", "{}": "{}", "bad json": "{model_type: llama",
    "utf-16": '{"model_type": "llama"}'.encode("utf-16"),
    "no model_type": lambda c: json.dumps({k: v for k, v in c.items() if k != "model_type"}),
    "model_type 7": lambda c: json.dumps({**c, "model_type": 7}),
    "unknown arch": lambda c: json.dumps({**c, "model_type": "no_such_arch"}),
    "no heads": lambda c: json.dumps({k: v for k, v in c.items() if k != "num_attention_heads"}),
    "heads 0": lambda c: json.dumps({**c, "num_attention_heads": 0}),
    "heads -4": lambda c: json.dumps({**c, "num_attention_heads": -4}),
    "heads '4'": lambda c: json.dumps({**c, "num_attention_heads": "4"}),
    "heads 4.5": lambda c: json.dumps({**c, "num_attention_heads": 4.5}),
    "heads true": lambda c: json.dumps({**c, "num_attention_heads": True}),
    "heads null": lambda c: json.dumps({**c, "num_attention_heads": None}),
    "kv 3": lambda c: json.dumps({**c, "num_key_value_heads": 3}),
    "kv 0": lambda c: json.dumps({**c, "num_key_value_heads": 0}),
    "head_dim 0": lambda c: json.dumps({**c, "head_dim": 0}),
    "vocab 0": lambda c: json.dumps({**c, "vocab_size": 0}),
    "layers 0": lambda c: json.dumps({**c, "num_hidden_layers": 0}),
    "layers 1e12": lambda c: json.dumps({**c, "num_hidden_layers": 10**12}),
    "layers 20000": lambda c: json.dumps({**c, "num_hidden_layers": 20_000}),
    "hidden 1": lambda c: json.dumps({**c, "hidden_size": 1, "head_dim": None}),
    "rope nan": lambda c: json.dumps({**c, "rope_theta": float("nan")}),
    "rope -1": lambda c: json.dumps({**c, "rope_theta": -1}),
    "max_pos 0": lambda c: json.dumps({**c, "max_position_embeddings": 0}),
}  # fmt: skip


# ---- the probes -------------------------------------------------------------------------------


def suite(w: Path, fixed: str, extra: str = "", name: str = "s") -> Path:
    path = w / "suites" / f"{name}-{abs(hash((fixed, extra))) % 10**9}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"fixed: {{{fixed}}}\n{extra}")
    return path


SMALL = "settings: {warmup_s: 0, min_samples: 1, max_samples: 1, budget_s: 0.1, rounds: 1}\n"


def probes(w: Path, f: dict) -> list[dict]:
    """Each probe: name, kind, argv, expect (refuse / ok / either), env, rows (a run's output)."""
    out = []

    def add(kind, name, argv, expect, env=None, run=False):
        out.append({"kind": kind, "name": name, "argv": [str(a) for a in argv], "env": env or {},
                    "expect": expect, "run": run})  # fmt: skip

    # -- model paths: each through a suite's dry run and through `plan --model`
    models = {
        "missing .gguf": (w / "nope.gguf", "refuse"), "empty .gguf": (w / "empty.gguf", "refuse"),
        "junk .gguf": (w / "junk.gguf", "refuse"), "text .gguf": (w / "text.gguf", "refuse"),
        "named pipe .gguf": (w / "pipe.gguf", "refuse"),
        "dir named .gguf": (w / "dir.gguf", "refuse"),
        "dir without config": (w / "nocfg", "refuse"), "symlink loop": (w / "loop.gguf", "refuse"),
        "/dev/zero": ("/dev/zero", "refuse"), "/dev/null": ("/dev/null", "refuse"),
        "config.json a pipe": (w / "pipe-dir", "refuse"),
        "weights a pipe": (w / "pipe-weights", "refuse"),
        "repo id offline": ("kvbench-probe/not-there", "refuse"),
        "good gguf": (f["gguf"], "ok"), "good dir": (f["dir"], "ok"),
    }  # fmt: skip
    models |= {f"gguf {k}": (f[f"meta:{k}"], "refuse") for k in META}
    models |= {f"config {k}": (f[f"cfg:{k}"], "refuse") for k in CONFIGS}
    for name, (path, expect) in models.items():
        s = suite(w, f"model: {path}, phase: quality, context_len: 32, kv_dtype: fp16")
        add("model path", f"run {name}", ["run", s, "--dry-run"], expect)
        plan_expect = "either" if name == "weights a pipe" else expect  # plan reads no weights
        add("model path", f"plan {name}", ["plan", "--model", path, "--context", "64"],
            plan_expect)  # fmt: skip

    # -- phases and axes beside the good tiny models (dry runs)
    g, d = f["gguf"], f["dir"]
    q = f"model: {g}, phase: quality, context_len: 32"
    gen = f"model: {g}, phase: generate, context_len: 32, gen_tokens: 4"
    ret = f"model: {d}, phase: retrieval, task: passkey, context_len: 256"
    axes = {
        "n_layers beside a model": (f"{q}, n_layers: 1", "refuse"),
        "head_dim beside a model": (f"{q}, head_dim: 48, kv_dtype: q4_0", "refuse"),
        "n_q_heads beside a model": (f"{q}, n_q_heads: 8", "refuse"),
        "n_kv_heads beside a model": (f"{q}, n_kv_heads: 1", "refuse"),
        "gqa_ratio beside a model": (f"{q}, gqa_ratio: 4", "refuse"),
        "qstart past the end": (f"{gen}, kv_dtype: int4, quantized_kv_start: 100000", "refuse"),
        "qstart one past": (f"{gen}, kv_dtype: int4, quantized_kv_start: 35", "refuse"),
        "qstart at the last": (f"{gen}, kv_dtype: int4, quantized_kv_start: 34", "ok"),
        "gen_tokens 1e9": (f"model: {g}, phase: generate, context_len: 32, gen_tokens: "
                           "1000000000", "refuse"),
        "gen_tokens 0": (f"model: {g}, phase: generate, context_len: 32, gen_tokens: 0", "refuse"),
        "gen_tokens -1": (f"model: {g}, phase: generate, context_len: 32, gen_tokens: -1",
                          "refuse"),
        "gen_tokens text": (f"model: {g}, phase: generate, context_len: 32, gen_tokens: many",
                            "refuse"),
        "gen_tokens past trained": (f"model: {g}, phase: generate, context_len: 200, "
                                    "gen_tokens: 100", "refuse"),
        "trials 1e9": (f"{ret}, trials: 1000000000", "refuse"),
        "trials 0": (f"{ret}, trials: 0", "refuse"),
        "chunks 1e9": (f"{q}, chunks: 1000000000", "refuse"),
        "chunks on retrieval": (f"{ret}, chunks: 2", "refuse"),
        "text on retrieval": (f"{ret}, text: {w / 'short.txt'}", "refuse"),
        "retrieval ctx 16": (f"model: {d}, phase: retrieval, task: passkey, context_len: 16",
                             "refuse"),
        "retrieval ctx 64": (f"model: {d}, phase: retrieval, task: passkey, context_len: 64",
                             "either"),
        "retrieval no task": (f"model: {d}, phase: retrieval, context_len: 256", "refuse"),
        "retrieval depth 2": (f"{ret}, depth: 2", "refuse"),
        "retrieval depth -0.5": (f"{ret}, depth: -0.5", "refuse"),
        "task on quality": (f"{q}, task: passkey", "refuse"),
        "retrieval good": (ret, "ok"),
        "quality ctx 2": (f"model: {g}, phase: quality, context_len: 2", "refuse"),
        "quality ctx 3": (f"model: {g}, phase: quality, context_len: 3", "refuse"),
        "generate ctx 2": (f"model: {g}, phase: generate, context_len: 2", "refuse"),
        "generate ctx 1": (f"model: {g}, phase: generate, context_len: 1", "refuse"),
        "generate chunks over the text": (f"{gen}, text: {w / 'short.txt'}, chunks: 4", "refuse"),
        "generate chunks 1e4 default text": (f"{gen}, chunks: 10000", "either"),
        "quality past trained": (f"model: {g}, phase: quality, context_len: 512", "refuse"),
        "quality past trained, asked": (f"model: {g}, phase: quality, context_len: 512, "
                                        "context_limit: beyond", "ok"),
        "V format vs head_dim": (f"model: {f['gguf48']}, phase: quality, context_len: 32, "
                                 "kv_dtype: fp16, v_dtype: q4_0", "refuse"),
        "K format vs head_dim": (f"model: {f['gguf48']}, phase: quality, context_len: 32, "
                                 "kv_dtype: q4_0", "refuse"),
        "v_dtype unknown": (f"{q}, v_dtype: fp5", "refuse"),
        "kv_dtype unknown": (f"{q}, kv_dtype: fp5", "refuse"),
        "window on model_decode": (f"model: {g}, phase: model_decode, context_len: 32, "
                                   "window: 8", "refuse"),
        "n_seqs 2 on quality": (f"{q}, n_seqs: 2", "refuse"),
        "unified on quality": (f"{q}, layout: unified", "refuse"),
        "kernel unknown": (f"{q}, kernel: nope", "refuse"),
        "text a pipe": (f"{q}, text: {w / 'pipe.txt'}", "refuse"),
        "text /dev/zero": (f"{q}, text: /dev/zero", "refuse"),
        "text missing": (f"{q}, text: {w / 'none.txt'}", "refuse"),
        "text too short": (f"{q}, text: {w / 'short.txt'}, chunks: 4", "refuse"),
        "kv_file a pipe": (f"model: tiny, context_len: 16, kv_data: file, kv_file: "
                           f"{w / 'pipe.out'}", "refuse"),
        "sink_tokens on decode": ("model: tiny, context_len: 16, sink_tokens: 4", "refuse"),
        "chunks on decode": ("model: tiny, context_len: 16, chunks: 2", "refuse"),
        "gen_tokens on quality": (f"{q}, gen_tokens: 8", "refuse"),
        "quality on a preset": ("model: llama-3-8b, phase: quality, context_len: 32", "refuse"),
        "quality on custom": ("model: custom, phase: quality, context_len: 32, n_layers: 1, "
                              "n_q_heads: 1, n_kv_heads: 1, head_dim: 64", "refuse"),
    }  # fmt: skip
    for name, (fixed, expect) in axes.items():
        add("phase/axis", name, ["run", suite(w, fixed), "--dry-run"], expect)

    # -- real runs of the tiny models (few, small): rows checked for what they claim
    runs = {
        "quality ok": (f"model: {d}, context_len: 32", "sweep: {kv_dtype: [fp16, int8]}\n"),
        "generate ok": (f"model: {d}, phase: generate, context_len: 32, gen_tokens: 4",
                        "sweep: {kv_dtype: [fp16, int4]}\n"),
        "generate qstart at the last": (f"model: {d}, phase: generate, context_len: 32, "
                                        "gen_tokens: 4, quantized_kv_start: 34, kv_dtype: int4",
                                        ""),
        "retrieval ok": (f"model: {d}, phase: retrieval, task: passkey, context_len: 256", ""),
        "model_decode ok": (f"model: {d}, phase: model_decode, context_len: 32", ""),
        "NaN weights quality": (f"model: {f['nan_dir']}, phase: quality, context_len: 32", ""),
        "NaN weights generate": (f"model: {f['nan_dir']}, phase: generate, context_len: 32, "
                                 "gen_tokens: 2", ""),
    }  # fmt: skip
    for name, (fixed, extra) in runs.items():
        fixed = fixed if "phase:" in fixed else f"{fixed}, phase: quality"
        s = suite(w, fixed, SMALL + extra, name="run")
        add("run", name, ["run", s, "--out", w / "out" / name.replace(" ", "_")], "ok", run=True)

    # -- outputs and result files
    run, bad = f["run"], f["badrun"]
    outs = {
        "report -o the run": (["report", run, "-o", run], "refuse"),
        "report -o new.csv": (["report", run, "-o", w / "new.csv"], "refuse"),
        "report -o notes.txt": (["report", run, "-o", w / "notes.txt"], "refuse"),
        "report -o a pipe": (["report", run, "-o", w / "pipe.out"], "refuse"),
        "report -o a pipe.html": (["report", run, "-o", w / "pipe.html"], "refuse"),
        "report -o site dir": (["report", run, "-o", w / "site"], "ok"),
        "report -o page": (["report", run, "-o", w / "page.html"], "ok"),
        "compare -o the run": (["compare", run, run, "-o", run], "refuse"),
        "compare -o a pipe": (["compare", run, run, "-o", w / "pipe.out"], "refuse"),
        "compare a pipe": (["compare", w / "pipe.csv", run], "refuse"),
        "history -o a run": (["history", run.parent, "-o", run], "refuse"),
        "history a dir with a pipe": (["history", w / "pipedir-runs"], "ok"),
        "history bad rows": (["history", bad.parent], "ok"),
        "report bad rows": (["report", bad, "-o", w / "bad.html"], "ok"),
        "compare bad rows": (["compare", bad, bad], "ok"),
        "import a pipe": (["import", w / "pipe.json", "--out", w / "imp"], "refuse"),
        "import 1e308 s": (["import", w / "huge.json", "--out", w / "imp2"], "refuse"),
        "import --out a file": (["import", ROOT / "tests/data/pytest-benchmark.json", "--out",
                                 w / "notes.txt"], "refuse"),
        "run --out a file": (["run", suite(w, f"model: {g}, phase: quality, context_len: 32"),
                              "--out", w / "notes.txt"], "refuse"),
        "run --out a pipe": (["run", suite(w, "model: tiny, context_len: 16"), "--out",
                              w / "pipe.out"], "refuse"),
        "run a pipe suite": (["run", w / "pipe.txt", "--dry-run"], "refuse"),
        "merge -o a file": (["merge", run.parent, "-o", w / "notes.txt"], "refuse"),
        "plan --head-dim beside a model": (["plan", "--model", g, "--head-dim", "48",
                                            "--context", "64"], "refuse"),
        "plan --n-layers beside a model": (["plan", "--model", g, "--n-layers", "1",
                                            "--context", "64"], "refuse"),
    }  # fmt: skip
    pipedir = w / "pipedir-runs"
    pipedir.mkdir(exist_ok=True)
    for p in run.parent.iterdir():
        (pipedir / p.name).symlink_to(p)
    os.mkfifo(pipedir / "zz.csv")
    os.mkfifo(w / "pipe.html")
    for name, (argv, expect) in outs.items():
        add("output", name, argv, expect)
    blas = {
        "KVBENCH_BLAS pipe --help": (["--help"], str(w / "pipe.so"), "ok"),
        "KVBENCH_BLAS pipe env": (["env"], str(w / "pipe.so"), "refuse"),
        "KVBENCH_BLAS /dev/null env": (["env"], "/dev/null", "refuse"),
        "KVBENCH_BLAS a dir env": (["env"], str(w), "refuse"),
        "KVBENCH_BLAS text file env": (["env"], str(w / "notes.txt"), "refuse"),
        "KVBENCH_BLAS pipe plan": (["plan", "--model", "tiny", "--context", "64"],
                                   str(w / "pipe.so"), "either"),
    }  # fmt: skip
    for name, (argv, value, expect) in blas.items():
        add("output", name, argv, expect, env={"KVBENCH_BLAS": value})
    return out


# ---- running and judging ----------------------------------------------------------------------


def run_one(p: dict) -> dict:
    limit = RUN_S if p["run"] else DRY_S
    env = {**os.environ, **p["env"], "HF_HUB_OFFLINE": "1"}
    t0 = time.time()
    try:
        cmd = [sys.executable, "-m", "kvbench", *p["argv"]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        rc, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, ""
    return {**p, "rc": rc, "stderr": err, "seconds": round(time.time() - t0, 1)}


def false_rows(p: dict) -> list[str]:
    """The ok rows of a run's output that claim what was not measured (module docstring)."""
    if not p["run"] or p["rc"] != 0:
        return []
    import pandas as pd

    from kvbench.kernels.model.source import model_shape

    out = Path(p["argv"][p["argv"].index("--out") + 1])
    found = []
    for csv in out.glob("*.csv"):
        if csv.name.endswith(".samples.csv"):
            continue
        for _, r in pd.read_csv(csv).iterrows():
            if r["status"] != "ok":
                continue
            s = model_shape(r["model"])
            shape = (r["n_layers"], r["n_q_heads"], r["n_kv_heads"], r["head_dim"])
            if shape != (s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim):
                found.append(f"{r['case_id']}: shape {shape} is not the model's")
            need = {"quality": ("ppl", "kl_mean", "top1_agree"),
                    "generate": ("gen_kl_mean", "gen_agree"),
                    "retrieval": ("accuracy",)}.get(r["phase"], ())  # fmt: skip
            for col in need:
                v = r.get(col)
                if v is None or not isinstance(v, (int, float)) or not math.isfinite(v):
                    found.append(f"{r['case_id']}: {col} is {v!r} in an ok row")
            if r["phase"] == "generate" and r.get("quantized_kv_start", 0) > (
                r["context_len"] + r["gen_tokens"] - 2
            ):
                found.append(f"{r['case_id']}: quantized_kv_start never reached")
    return found


def verdict(r: dict) -> str:
    lines = [x for x in r["stderr"].splitlines() if x.strip()]
    if r["rc"] is None:
        return "hang"
    if "Traceback" in r["stderr"]:
        return "traceback"
    if r["rc"] < 0 or r["rc"] >= 128:
        return "crash"
    if r["false_rows"]:
        return "false rows"
    if r["rc"] == 2:
        one = len(lines) == 1 or (lines and all(x.startswith("kvbench: ") for x in lines))
        if not (lines and lines[-1].startswith("kvbench: ") and one):
            return "messy refusal"
        return "wrongly refused" if r["expect"] == "ok" else "refused"
    if r["rc"] == 0:
        return "wrongly accepted" if r["expect"] == "refuse" else "accepted"
    return f"exit {r['rc']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="probes run at once (default 2)")
    ap.add_argument("--list", action="store_true", help="list every probe with its verdict")
    ap.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    args = ap.parse_args()
    w = Path(args.keep or tempfile.mkdtemp(prefix="kvbench-probe-"))
    w.mkdir(parents=True, exist_ok=True)
    f = write_fixtures(w)
    todo = probes(w, f)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_one, todo))
    tally: dict = {}
    for r in results:
        r["false_rows"] = false_rows(r)
        r["verdict"] = verdict(r)
        tally.setdefault(r["kind"], {}).setdefault(r["verdict"], 0)
        tally[r["kind"]][r["verdict"]] += 1
        bad = r["verdict"] not in ("refused", "accepted")
        if args.list or bad:
            last = (r["stderr"].strip().splitlines() or [""])[-1][:160]
            print(f"{r['verdict']:>16}  {r['kind']:<10} {r['name']}  ({r['seconds']} s)  {last}")
            for line in r["false_rows"]:
                print(f"{'':>18}{line}")
    print(f"\n{len(results)} inputs:")
    for kind, counts in tally.items():
        print(f"  {kind:<10} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    total = {k: sum(c.get(k, 0) for c in tally.values()) for k in
             ("traceback", "crash", "hang", "false rows")}  # fmt: skip
    print("  failures: " + ", ".join(f"{k} {v}" for k, v in total.items()))
    return 1 if any(total.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
