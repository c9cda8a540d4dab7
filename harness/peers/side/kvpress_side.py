"""kvpress's side of the kvpress peer: run inside kvpress's own environment
(harness/peers/kvpress_build.py), never imported by kvbench (it needs torch and kvpress).

Reads one JSON request (a file path as argv[1], or stdin) and prints one JSON answer on stdout.
The request names the GGUF file, the context's token ids, the presses and compression ratios:

* mode "kept": ONE prefill of the context with every (press, ratio) hooked through kvpress's own
  `press(model)` context manager and forward hook, each press's own `compress` run at every
  layer and recorded, and its result handed back uncompressed (a pass-through), so every press
  sees the full cache of its layer, as it would alone: in kvpress the cache a layer writes is
  compressed after that layer's attention, so no later layer's input depends on it.
* mode "answer": the "kept" prefill, then per (press, ratio) kvpress's own
  KVPressTextGenerationPipeline.generate_answer over the cache that press's compress leaves
  (the kept K/V gathered in its top-k order): the question never compressed, its positions
  from the uncompressed context length, a greedy answer of at most max_new_tokens; and the
  answer with the full cache (press None).
* mode "pipeline": KVPressTextGenerationPipeline._forward itself per (press, ratio), a prefill
  each: what mode "answer" is checked against (tests/test_kvpress.py).
* with `n_logits` (modes "kept", "answer"): the last n_logits positions' logits of the full
  prefill and every layer's keys as stored (after RoPE), written to `dump` (npz), to check that
  kvbench and transformers read the same weights from the GGUF before comparing what is kept.

Kept positions: the press's scores are captured as ScorerPress.compress computes them, and the
kept indices are `scores.topk(n_kept)` as compress takes them; that the gathered keys equal the
keys compress returned is checked (`gather_ok`). Per layer and KV head: a bit mask of the
context's positions (numpy packbits, hex), and the score ties at the cut.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

PRESSES = {  # press name (kvpress's class name) -> constructor keyword defaults kept as kvpress's
    "SnapKVPress": {},
    "StreamingLLMPress": {},
    "KnormPress": {},
    "TOVAPress": {},
    "ExpectedAttentionPress": {},
}


def load(gguf: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # its bars would fill the caller's captured stderr
    path = Path(gguf)
    kw = {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    return model.eval(), tok


def make_press(name: str, ratio: float, params: dict):
    import kvpress

    if name not in PRESSES:
        raise SystemExit(f"unknown press {name!r}; known: {', '.join(PRESSES)}")
    return getattr(kvpress, name)(compression_ratio=ratio, **{**PRESSES[name], **params})


def cut_ties(scores: torch.Tensor, n_kept: int, kept: torch.Tensor) -> list[dict]:
    """Per KV head: the n_kept-th score, how many positions hold exactly it, how many of those
    were kept (fewer kept than tied: top-k's tie-break chose), and the gap to the next one."""
    out = []
    for h in range(scores.shape[0]):
        s = scores[h]
        top = torch.sort(s, descending=True).values
        at = top[n_kept - 1]
        tied = int((s == at).sum())
        tied_kept = int((s[kept[h]] == at).sum())
        gap = float(at - top[n_kept]) if n_kept < s.numel() else None
        out.append({"score": float(at), "tied": tied, "tied_kept": tied_kept, "gap": gap})
    return out


def mask_hex(kept_h: torch.Tensor, length: int) -> str:
    mask = np.zeros(length, dtype=bool)
    mask[kept_h.numpy()] = True
    return np.packbits(mask).tobytes().hex()


def instrument(press, passthrough: bool, layers: dict) -> None:
    """Wrap this press instance's score and compress: record what compress keeps per layer."""
    score, compress = press.score, press.compress
    seen = {}

    def scored(*args, **kwargs):
        seen["scores"] = score(*args, **kwargs)
        return seen["scores"]

    def compressed(module, hidden_states, keys, values, attentions, kwargs):
        out_k, out_v = compress(module, hidden_states, keys, values, attentions, kwargs)
        layers[module.layer_idx] = record(keys, seen.pop("scores", None), out_k)
        return (keys, values) if passthrough else (out_k, out_v)

    press.score, press.compress = scored, compressed


def record(keys: torch.Tensor, scores, out_k: torch.Tensor) -> dict:
    """What compress kept, from the scores it computed (batch 1); `order` holds the kept
    indices in top-k order (the order compress stores them in), kept in memory only."""
    length, n_kept = keys.shape[2], out_k.shape[2]
    if scores is None:  # ratio 0: compress returns the cache untouched
        idx = torch.arange(length).expand(keys.shape[1], length)
        return {"n_kept": n_kept, "masks": [mask_hex(i, length) for i in idx], "gather_ok": True,
                "order": idx}  # fmt: skip
    idx = scores[0].topk(n_kept, dim=-1).indices  # [Hkv, n_kept], as ScorerPress.compress
    gathered = keys[0].gather(1, idx.unsqueeze(-1).expand(-1, -1, keys.shape[3]))
    return {
        "n_kept": n_kept,
        "masks": [mask_hex(i, length) for i in idx],
        "gather_ok": bool(torch.equal(gathered, out_k[0])),
        "ties": cut_ties(scores[0].float(), n_kept, idx),
        "scores": scores[0].float(),
        "order": idx,
    }


HIDDEN = ("scores", "order")  # kept in memory, not printed


def strip(layers: dict, dump: dict | None, key: str) -> list[dict]:
    ordered = [layers[i] for i in sorted(layers)]
    if dump is not None and ordered and "scores" in ordered[0]:
        dump[key] = torch.stack([r["scores"] for r in ordered]).numpy()
    return [{k: v for k, v in r.items() if k not in HIDDEN} for r in ordered]


def hooked(req: dict, passthrough: bool) -> list[dict]:
    """A press instance per (press, ratio) of the request, each instrumented."""
    runs = []
    for name in req["presses"]:
        for ratio in req["ratios"]:
            press, layers = make_press(name, ratio, req.get("params", {}).get(name, {})), {}
            instrument(press, passthrough, layers)
            runs.append({"press": name, "compression_ratio": ratio, "obj": press, "l": layers})
    return runs


def prefill_all(model, ids: list[int], runs: list[dict]):
    """ONE prefill of the context, every press hooked through its own context manager, none
    compressing (pass-through); the full cache and the prefill's seconds."""
    from contextlib import ExitStack

    from transformers import DynamicCache

    cache = DynamicCache()
    start = time.perf_counter()
    with ExitStack() as stack, torch.no_grad():
        for r in runs:
            stack.enter_context(r["obj"](model))
        hidden = model.model(input_ids=torch.tensor([ids]), past_key_values=cache)[0]
    return cache, round(time.perf_counter() - start, 2), hidden


def dump_logits(model, cache, hidden, req: dict, dump: dict | None) -> None:
    """With n_logits: the last n_logits positions' logits and every layer's keys as stored
    (after RoPE), to check that both sides read the same weights from the GGUF."""
    n = req.get("n_logits")
    if n and dump is not None:
        with torch.no_grad():
            dump["logits"] = model.lm_head(hidden[0, -n:]).float().numpy()
        dump["keys"] = torch.stack([cache.layers[i].keys[0] for i in range(len(cache))]).numpy()


def summary(r: dict, dump: dict | None) -> dict:
    return {
        "press": r["press"],
        "compression_ratio": r["compression_ratio"],
        "params": {k: v for k, v in vars(r["obj"]).items() if isinstance(v, (int, float, bool))},
        "layers": strip(r["l"], dump, f"{r['press']}@{r['compression_ratio']}"),
    }


def run_kept(model, req: dict, dump: dict | None) -> dict:
    runs = hooked(req, True)
    full, seconds, hidden = prefill_all(model, req["context_ids"], runs)
    dump_logits(model, full, hidden, req, dump)
    return {"prefill_seconds": seconds, "runs": [summary(r, dump) for r in runs]}


def pressed_cache(full, layers: dict | None):
    """The cache kvpress's prefill would leave: each layer's K/V gathered at the kept indices
    in top-k order, as ScorerPress.compress gathers them (None: the full cache)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i in range(len(full)):
        k, v = full.layers[i].keys, full.layers[i].values
        if layers is not None:
            idx = layers[i]["order"].unsqueeze(0).unsqueeze(-1).expand(-1, -1, -1, k.shape[3])
            k, v = k.gather(2, idx).contiguous(), v.gather(2, idx).contiguous()
        cache.update(k, v, i)
    return cache


def answerer(model, tok):
    """kvpress's pipeline and a recorder of the ids its generate_answer decodes."""
    from kvpress import KVPressTextGenerationPipeline

    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tok)
    decoded, decode = [], tok.decode
    tok.decode = lambda ids, **kw: decoded.append([int(i) for i in ids]) or decode(ids, **kw)
    return pipe, decoded


def run_answers(model, tok, req: dict, dump: dict | None) -> dict:
    """One prefill (every press recorded, pass-through), then per (press, ratio) kvpress's own
    generate_answer over the cache its compress would have left, plus the uncompressed answer.
    Equal to KVPressTextGenerationPipeline._forward per press (mode "pipeline"; checked in
    tests/test_kvpress.py): a press changes only the cache a layer leaves, never a layer's
    output, so one prefill serves every press."""
    runs = hooked(req, True)
    full, seconds, hidden = prefill_all(model, req["context_ids"], runs)
    dump_logits(model, full, hidden, req, dump)
    pipe, decoded = answerer(model, tok)
    question = torch.tensor([req["question_ids"]])
    out = []
    asked = req.get("answer_ratios", req["ratios"])  # generations cost: the others keep only
    for r in [None, *runs]:
        if r is not None and r["compression_ratio"] not in asked:
            out.append(summary(r, dump))
            continue
        start = time.perf_counter()
        cache = pressed_cache(full, None if r is None else r["l"])
        with torch.no_grad():
            text = pipe.generate_answer(question, cache, len(req["context_ids"]),
                                        req["max_new_tokens"])  # fmt: skip
        row = {"press": None, "compression_ratio": 0.0} if r is None else summary(r, dump)
        row.update(answer=text, answer_ids=decoded[-1])
        out.append({**row, "seconds": round(time.perf_counter() - start, 2)})
    return {"prefill_seconds": seconds, "runs": out}


def run_pipeline(model, tok, req: dict, dump: dict | None) -> dict:
    """kvpress's own KVPressTextGenerationPipeline._forward per (press, ratio): a prefill each,
    the cache really compressed by the press's hook (the slow path "answer" is checked by)."""
    pipe, decoded = answerer(model, tok)
    inputs = {
        "context_ids": torch.tensor([req["context_ids"]]),
        "questions_ids": [torch.tensor([req["question_ids"]])],
    }
    out = []
    for r in [None, *hooked(req, False)]:
        start = time.perf_counter()
        with torch.no_grad():
            text = pipe._forward(inputs, max_new_tokens=req["max_new_tokens"],
                                 press=None if r is None else r["obj"])[0]  # fmt: skip
        row = {"press": None, "compression_ratio": 0.0} if r is None else summary(r, dump)
        row.update(answer=text, answer_ids=decoded[-1])
        out.append({**row, "seconds": round(time.perf_counter() - start, 2)})
    return {"runs": out}


def versions() -> dict:
    import importlib.metadata as md

    import transformers

    return {"kvpress": md.version("kvpress"), "torch": torch.__version__,
            "transformers": transformers.__version__}  # fmt: skip


def main() -> int:
    req = json.loads(Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read())
    torch.manual_seed(0)
    start = time.perf_counter()
    model, tok = load(req["gguf"])
    out = {"versions": versions(), "load_seconds": round(time.perf_counter() - start, 2)}
    out["attn_implementation"] = model.config._attn_implementation
    out["context_tokens"] = len(req["context_ids"])
    dump = {} if req.get("dump") else None
    mode = req.get("mode", "kept")
    if mode == "kept":
        out.update(run_kept(model, req, dump))
    elif mode == "answer":
        out.update(run_answers(model, tok, req, dump))
    elif mode == "pipeline":
        out.update(run_pipeline(model, tok, req, dump))
    else:
        raise SystemExit(f"unknown mode {mode!r}: kept, answer or pipeline")
    if dump is not None:
        np.savez(req["dump"], **dump)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
