"""kvbench's cache policies held against kvpress's presses on kvbench's retrieval prompts
(issue 42 item 4; docs/peers.md, "kvpress"): kept positions per layer and KV head, and the
greedy answers with the context compressed and the question never compressed.

    python scripts/kvpress_agreement.py --task passkey --context 2048 --out results/kvpress/
    python scripts/kvpress_agreement.py --side-json X.out --side-request X.json ...  # reuse

kvpress's side runs once per prompt (harness/peers/kvpress.py, mode "answer": one prefill, every
press and ratio recorded, answers over the cache each press leaves). kvbench's side also runs
ONE prefill: a fan-out policy passes every observation to one policy per (policy, ratio), then
each layer's cells are selected by each policy's own select() (as EvictingCache.compress asks
it), and for the answers a copy of the prefilled cache per (policy, ratio) is compressed by
compress() itself and the question and greedy answer run through it. Prints one JSON line per
(policy, ratio) and writes them to --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from kvbench.kernels.model import policies as P
from kvbench.kernels.model import run as R
from kvbench.kernels.model.evicting import make_policy_cache
from kvbench.kernels.model.fetch import model_path
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.policies.common import top
from kvbench.kernels.model.protocol import Observation
from kvbench.kernels.model.retrieval import (
    build_prompt,
    chat_frame,
    extract,
    make_trial,
    tokenizer_of,
)
from kvbench.kernels.model.spec import CacheSpec
from kvbench.peers import kvpress as K

POLICIES = tuple(K.PRESSES)  # snapkv, window, knorm, tova, expected_attention
RATIOS = (0.25, 0.5, 0.75)


class FanOut:
    """One policy that observes for many: every observation goes to each of them."""

    name, decode = "fanout", False

    def __init__(self, members: dict):
        self.members = members

    def observe(self, obs: Observation) -> None:
        for p in self.members.values():
            p.observe(obs)

    def select(self, obs):  # never asked: kvbench's compress() runs on the copies
        raise NotImplementedError

    def state_bytes(self) -> int:
        return 0


def prompt_of(task: str, context: int, depth: float, seed: int):
    tok, md = tokenizer_of("smollm2-135m")
    trial = make_trial(task, seed)
    p = build_prompt(trial, tok, context, depth, seed, chat_frame(tok, md))
    return p, trial, tok


def layer_obs(cache, layer: int) -> Observation:
    """The observation compress() hands select() (kernels/model/evicting.py)."""
    last = cache.last[layer]
    kd, vd = cache.dense(layer, mx.float32)
    pos = cache.pos[layer][:, : cache.cells[layer]].copy()
    return Observation(layer, cache.n_layers, last.q, last.q_start, kd, vd, pos, last.rope)


def kept_and_scores(cache, members: dict, n: int) -> dict:
    """(policy, ratio) -> (bool kept [L, Hkv, n], float32 scores [L, Hkv, n] or None)."""
    out = {key: ([], []) for key in members}
    for layer in range(cache.n_layers):
        obs = layer_obs(cache, layer)
        for key, pol in members.items():
            if not hasattr(pol, "score"):  # window: its own select
                out[key][0].append(pol.select(obs))
                out[key][1].append(None)
                continue
            # a scorer's select is top(score, budget.kept(n)) (kernels/model/policies/); its
            # score is computed once (expected_attention's consumes its query statistics)
            score = np.array(pol.score(obs))
            out[key][0].append(top(score, pol.budget.kept(obs.n_positions)))
            out[key][1].append(score)
    return {
        k: (np.stack(m), None if s[0] is None else np.stack(s).astype(np.float32))
        for k, (m, s) in out.items()
    }


def answer_with(base, pol, model, question: list[int], gen: int, eog, kept=None,
                once: bool = True) -> list[int]:  # fmt: skip
    """A copy of the prefilled cache, compressed as compress() does (each layer keeps the
    cells `kept` [L, Hkv, n] says: what pol's select chose, computed once in kept_and_scores),
    then the question and a greedy answer. A decode policy (window, tova) keeps selecting after
    each pass unless `once` (kvpress's setup: every press compresses once, at the end of the
    context, and the question and answer are appended to what it kept)."""
    if once and pol.decode:
        pol = copy.copy(pol)
        pol.decode = False  # this copy selects once: EvictingCache._observe / advance read it
    c = copy.copy(base)
    c.k = [{n: mx.array(a) for n, a in s.items()} for s in base.k]
    c.v = [{n: mx.array(a) for n, a in s.items()} for s in base.v]
    c.pos, c.cells, c.last = [p.copy() for p in base.pos], list(base.cells), list(base.last)
    c.policy = pol
    for layer in range(c.n_layers):
        c.keep(layer, kept[layer] if kept is not None else pol.select(layer_obs(c, layer)))
    c.compressed = True
    if len(question) > 1:
        R.prefill(model, c, question[:-1])
    token, out = question[-1], []
    for _ in range(gen):
        token = int(mx.argmax(R.decode(model, c, token)).item())
        out.append(token)
        if len(out) > 1 and token in eog:  # as kvpress's generate_answer: it keeps the eos
            break  # id and stops, testing every token but the first (pipeline.py)
    return out


def kvbench_side(model, ctx: list[int], question: list[int], gen: int, answer_ratios,
                 eog: frozenset[int], once: bool) -> dict:  # fmt: skip
    members = {(name, r): P.make(name, P.Budget(compression_ratio=r)) for name in POLICIES
               for r in RATIOS}  # fmt: skip
    base = make_policy_cache(CacheSpec("fp32"), model, len(ctx) + len(question) + gen,
                             "reference", FanOut(members))  # fmt: skip
    start = time.perf_counter()
    R.prefill(model, base, ctx, 512)
    prefill_s = time.perf_counter() - start
    print(f"kvbench prefill of {len(ctx)} tokens: {prefill_s:.0f} s", file=sys.stderr, flush=True)
    kept = kept_and_scores(base, members, len(ctx))
    print(f"kept: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    full = P.make("knorm", P.Budget(compression_ratio=0.0))  # keeps every cell
    answers = {None: answer_with(base, full, model, question, gen, eog)}  # first: base untouched
    seconds = {}
    for key, pol in members.items():
        if key[1] in answer_ratios:
            t = time.perf_counter()
            answers[key] = answer_with(base, pol, model, question, gen, eog, kept[key][0], once)
            seconds[key] = time.perf_counter() - t
            print(f"answer {key}: {seconds[key]:.0f} s", file=sys.stderr, flush=True)
    return {"kept": kept, "answers": answers, "prefill_s": prefill_s, "seconds": seconds}


def rows(side: dict, mine: dict, tok, task: str, truth: str) -> list[dict]:
    """One row per (policy, ratio): agreement per layer, the trace, the answers."""
    scores = side.get("dump", {})
    runs = K.press_runs(side["answer"])
    out = []
    for (name, r), (ours, our_s) in mine["kept"].items():
        press = K.PRESSES[name]
        theirs = runs[(press, r)]
        a = K.agreement(ours, theirs.kept)
        t = K.trace(ours, theirs.kept, our_s, scores.get(f"{press}@{r}"))
        row = {"policy": name, "press": press, "compression_ratio": r,
               "context_tokens": int(ours.shape[-1]), "layers": int(ours.shape[0]),
               "heads_equal": a["heads_equal"], "heads": a["heads"],
               "layers_equal": a["layers_equal"], "agree_min": float(a["agree"].min()),
               "agree_mean": float(a["agree"].mean()),
               "agree_per_layer": [round(float(x), 5) for x in a["agree"].mean(-1)],
               "positions_differing": int((ours ^ theirs.kept).sum()), "trace": t}  # fmt: skip
        if (name, r) in mine["answers"]:
            ids = mine["answers"][(name, r)]
            row.update(answer_kvbench=tok.decode(ids), answer_kvpress=theirs.answer,
                       ids_equal=list(theirs.answer_ids) == ids,
                       got_kvbench=extract(task, tok.decode(ids)),
                       got_kvpress=extract(task, theirs.answer or ""), truth=truth)  # fmt: skip
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="passkey")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--answer-ratios", type=float, nargs="*", default=list(RATIOS))
    ap.add_argument("--side-json", help="kvpress's answer already computed (its stdout)")
    ap.add_argument("--side-dump", help="its npz (scores)")
    ap.add_argument("--out", default="results/kvpress")
    ap.add_argument("--evict", choices=("once", "policy"), default="once",
                    help="once (kvpress's setup, the default): window and tova compress at the "
                    "context's end only; policy: they keep evicting through the question and "
                    "answer, as kvbench's decode policies do in a suite")  # fmt: skip
    args = ap.parse_args()
    p, trial, tok = prompt_of(args.task, args.context, args.depth, args.seed)
    cut = p.haystack[1]
    ctx, question = p.tokens[:cut], p.tokens[cut:]
    gguf = model_path()
    start = time.perf_counter()
    if args.side_json:
        answer = json.loads(Path(args.side_json).read_text().strip().splitlines()[-1])
        dump = K.load_dump(args.side_dump) if args.side_dump else {}
        if answer["context_tokens"] != len(ctx):
            raise SystemExit(f"{args.side_json}: {answer['context_tokens']} context tokens, "
                             f"this prompt has {len(ctx)}")  # fmt: skip
    else:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        npz = out_dir / f"{args.task}-{args.context}.npz"
        req = K.request(gguf, ctx, POLICIES, RATIOS, "answer", question_ids=question,
                        max_new_tokens=trial.gen_tokens, answer_ratios=args.answer_ratios,
                        dump=str(npz))  # fmt: skip
        answer, dump = K.run_side(req, timeout_s=4 * 3600), K.load_dump(npz)
    side_s = time.perf_counter() - start
    model = load_model(gguf)
    start = time.perf_counter()
    eos = frozenset({tok.eos_id})  # kvpress stops at generation_config.eos_token_id (the GGUF's)
    mine = kvbench_side(model, ctx, question, trial.gen_tokens, args.answer_ratios, eos,
                        args.evict == "once")  # fmt: skip
    ours_s = time.perf_counter() - start
    full_kvpress, full_ids = K.full_answer(answer)
    result = {
        "task": args.task, "evict": args.evict, "context_len": args.context, "depth": args.depth,
        "seed": args.seed,
        "prompt_tokens": len(p.tokens), "context_tokens": len(ctx),
        "question_tokens": len(question), "gen_tokens": trial.gen_tokens, "truth": trial.answer,
        "full_answer_kvbench": tok.decode(mine["answers"][None]),
        "full_answer_kvpress": full_kvpress,
        "full_ids_equal": list(full_ids) == mine["answers"][None],
        "kvpress_seconds": answer.get("prefill_seconds"), "kvpress_wall_s": round(side_s, 1),
        "kvbench_prefill_s": round(mine["prefill_s"], 1), "kvbench_wall_s": round(ours_s, 1),
        "rows": rows({"answer": answer, "dump": dump}, mine, tok, args.task, trial.answer),
    }  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.task}-{args.context}.agreement.json").write_text(json.dumps(result, indent=1))
    for r in result["rows"]:
        print(json.dumps({k: v for k, v in r.items() if k != "agree_per_layer"}))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
