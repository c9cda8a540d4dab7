"""Many sequences served at once: llama-batched-bench's schedule on kvbench's model cache.

llama-batched-bench (llama.cpp b11434 tools/batched-bench/batched-bench.cpp, the tree kvbench
builds) times, for pp prompt tokens, tg generated tokens and pl parallel sequences: the prompts'
prefill (every sequence's prompt, or one prompt shared by all with -pps, then copied to each
sequence's cells, untimed), then tg decode steps of one token for every sequence; N_KV, the
cells required, is pl*(pp + tg), or with a shared prompt pp + pl*tg in a unified cache. `run`
does the same through a SeqCache (kernels/model/batched.py): the prompts go through the model in
micro-batches of `ubatch` tokens per sequence (all sequences in each pass), then every decode
step is one pass of pl rows, each sequence fed its own greedy token. Every pass is timed from
building its graph to the end of its `mx.eval` (MLX is lazy), with time.perf_counter; the
cache's writes are evaluated with the logits.

`check_alone` is the truth of the batch: a sequence run alone through the single-sequence cache
(kernels/model/cache.py make_cache), teacher-forced with the tokens the batch gave it, must
produce the batch's logits (within float tolerance) and the same greedy tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from kvbench.kernels.model import seam
from kvbench.kernels.model.batched import SeqCache
from kvbench.kernels.model.cache import make_cache


def cells_held(pp: int, tg: int, pl: int, shared: bool, unified: bool) -> int:
    """llama-batched-bench's N_KV: the cells the schedule holds, pl*(pp + tg), a shared prompt
    once when unified (pp + pl*tg) and once per sequence's stream per-stream."""
    return pp + pl * tg if shared and unified else pl * (pp + tg)


def stream_cells(pp: int, tg: int, pl: int, shared: bool, unified: bool) -> int:
    """Cells one stream needs: its own sequence's pp + tg per-stream, every sequence's unified."""
    return cells_held(pp, tg, pl, shared, unified) if unified else pp + tg


@dataclass
class Served:
    pp: int
    tg: int
    pl: int
    shared: bool
    unified: bool
    t_pp: float = 0.0  # seconds: the prompts' passes
    step_s: list[float] = field(default_factory=list)  # each decode step's seconds
    tokens: np.ndarray | None = None  # [pl, tg] the greedy tokens each sequence generated
    logits: list = field(default_factory=list)  # per step [pl, vocab] float32 (numpy), if kept

    @property
    def t_tg(self) -> float:
        return float(sum(self.step_s))

    def fields(self) -> dict:
        """llama-batched-bench's figures under its names (seconds, tokens per second)."""
        t = self.t_pp + self.t_tg
        n_pp = self.pp if self.shared else self.pl * self.pp
        n_kv = cells_held(self.pp, self.tg, self.pl, self.shared, self.unified)
        steps_ms = 1e3 * np.asarray(self.step_s)
        return {
            "pp": self.pp, "tg": self.tg, "pl": self.pl, "n_kv_req": n_kv,
            "t_pp": self.t_pp, "s_pp": n_pp / self.t_pp, "t_tg": self.t_tg,
            "s_tg": self.pl * self.tg / self.t_tg, "t": t,
            "s": (n_pp + self.pl * self.tg) / t,
            "tg_step_ms": float(np.median(steps_ms)),
            "tg_step_p10_ms": float(np.percentile(steps_ms, 10)),
            "tg_step_p90_ms": float(np.percentile(steps_ms, 90)),
        }  # fmt: skip


def _pass(model, cache: SeqCache, rows, tokens: np.ndarray, logits: bool = True):
    """Tokens [B, n] for batch rows `rows` through the model, evaluated with the cache's
    writes: logits [B, vocab] of each row's last token (float32), or None. The tokens before the
    last go through a pass of their own whose logits are never evaluated, so the output head
    (49,152 rows on SmolLM2) runs for one token a row (as run.forward's logits_from)."""
    head = tokens if not logits else tokens[:, :-1]
    if head.shape[1]:
        cache.plan(rows, head)
        seam.forward(model, mx.array(head.tolist()), cache)
    if not logits:
        mx.eval(cache.arrays())
        return None
    cache.plan(rows, tokens[:, -1:])
    logits = seam.forward(model, mx.array(tokens[:, -1:].tolist()), cache)[:, -1]
    logits = logits.astype(mx.float32)
    mx.eval(logits, cache.arrays())
    return logits


def run(model, cache: SeqCache, prompts: np.ndarray, tg: int, ubatch: int, keep=()) -> Served:
    """prompts [pl, pp] (one row: a prompt every one of cache.layout's n_seq_max sequences
    shares); tg greedy decode steps for every sequence; keep: the sequences whose logits are
    kept (check_alone)."""
    pl = cache.layout.n_seq_max
    shared = prompts.shape[0] == 1 and pl > 1
    rows = [tuple(range(pl))] if shared else [(s,) for s in range(pl)]
    out = Served(prompts.shape[1], tg, pl, shared, cache.layout.kind == "unified")
    start = time.perf_counter()
    for s in range(0, out.pp, ubatch):  # logits of the prompt's last token only
        last = _pass(model, cache, rows, prompts[:, s : s + ubatch], s + ubatch >= out.pp)
    out.t_pp = time.perf_counter() - start
    nxt = np.asarray(mx.argmax(last, axis=-1)).reshape(-1, 1)
    nxt = np.repeat(nxt, pl, axis=0) if shared else nxt  # [pl, 1]
    gen, every = [], [(s,) for s in range(pl)]
    for _ in range(tg):
        gen.append(nxt[:, 0])
        start = time.perf_counter()
        logits = _pass(model, cache, every, nxt)
        out.step_s.append(time.perf_counter() - start)
        if keep:
            out.logits.append(np.array(logits[mx.array(list(keep))]))
        nxt = np.asarray(mx.argmax(logits, axis=-1)).reshape(-1, 1)
    out.tokens = np.stack(gen, axis=1)  # [pl, tg]
    return out


def check_alone(model, spec, kernel: str, prompt: np.ndarray, served: Served, i: int, seq: int,
                tile_kv=None) -> tuple[float, float]:  # fmt: skip
    """Sequence `seq` (the i-th of served's kept ones) run alone, teacher-forced with the
    tokens the batch generated for it: (the largest |logit| difference from the batch's over
    the tg decode steps, the fraction of the tg + 1 greedy choices (the prompt's, then each
    step's) that are the batch's)."""
    cache = make_cache(spec, model.config, served.pp + served.tg, kernel, tile_kv)
    first = seam.forward(model, mx.array([prompt.tolist()]), cache)[0, -1]
    diffs, agree = [], int(int(mx.argmax(first).item()) == served.tokens[seq, 0])
    for t in range(served.tg):
        logits = seam.forward(model, mx.array([[int(served.tokens[seq, t])]]), cache)[0, -1]
        logits = np.array(logits.astype(mx.float32))
        batch = served.logits[t][i]
        diffs.append(float(np.max(np.abs(logits - batch))))
        agree += int(np.argmax(logits) == np.argmax(batch))
    return max(diffs), agree / (served.tg + 1)
