"""NVIDIA kvpress as a peer: which context positions its presses keep, and what its pipeline
answers, on kvbench's own tokens, next to kvbench's cache policies.

kvpress runs in its own environment (kvpress_build.py, `make kvpress`); this module runs
side/kvpress_side.py there through a subprocess with a JSON request (the GGUF path, the
context's and the question's token ids, press names, compression ratios) and parses the JSON it
prints. It imports neither torch nor kvpress, and nothing of kernels/: the comparison takes
plain arrays, so kvbench's side (the policy functions) is the caller's.

What is compared, per layer and KV head: the set of context positions each side keeps at the
same compression ratio (kvpress's definition: the fraction of positions removed; it keeps
int(n x (1 - ratio)) per head, utils.compute_n_kept). A difference is traced, position by
position, to (a) a score tie at kvpress's cut (top-k's tie-break chose among equal scores),
(b) a near tie: kvbench's score of the position within `rel_tol` of kvbench's own cut (the two
sides' float32 arithmetic differs in the last bits: torch vs MLX, and transformers' own GGUF
dequantization), or (c) unexplained.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.peers import kvpress_build

SIDE = Path(__file__).parent / "side" / "kvpress_side.py"
# kvbench's policy name -> kvpress's press (kvpress 0.5.5, kvpress/presses/*.py)
PRESSES = {
    "snapkv": "SnapKVPress",
    "window": "StreamingLLMPress",
    "knorm": "KnormPress",
    "tova": "TOVAPress",
    "expected_attention": "ExpectedAttentionPress",
}
QUIET = {"TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


class KvpressError(RuntimeError):
    """The side process failed: its exit code and the tail of its stderr."""


def missing_reason() -> str | None:
    """Why the kvpress peer cannot run here (None: its environment is built)."""
    directory = kvpress_build.env_dir()
    stamp = kvpress_build.read_stamp(directory)
    if stamp is None:
        return f"kvpress's environment is not built (make kvpress): no {directory}/build.json"
    if not kvpress_build.is_built(stamp):
        return f"kvpress's environment failed to build: {stamp.get('reason', 'unknown')}"
    return None


def run_side(request: dict, timeout_s: float = 3600) -> dict:
    """Run the side script in kvpress's environment on `request`; its JSON answer."""
    why = missing_reason()
    if why:
        raise KvpressError(why)
    python = kvpress_build.read_stamp(kvpress_build.env_dir())["python"]
    with tempfile.TemporaryDirectory(prefix="kvbench-kvpress-") as tmp:
        path = Path(tmp) / "request.json"
        path.write_text(json.dumps(request))
        done = subprocess.run([python, str(SIDE), str(path)], capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, **QUIET})  # fmt: skip
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise KvpressError(f"kvpress side exited {done.returncode}: {' | '.join(tail)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def request(gguf: str | Path, context_ids, presses, ratios, mode: str = "kept", **extra) -> dict:
    """A side request; `presses` in kvbench's policy names or kvpress's class names."""
    names = [PRESSES.get(p, p) for p in presses]
    unknown = [n for n in names if n not in PRESSES.values()]
    if unknown:
        raise ValueError(f"no kvpress press for {unknown}; known: {', '.join(PRESSES)}")
    ids = [int(i) for i in context_ids]
    req = {"gguf": str(gguf), "context_ids": ids, "presses": names, "ratios": list(ratios)}
    return {**req, "mode": mode, **extra}


# ---- what the side printed, as arrays ---------------------------------------------------------


def masks_of(layers: list[dict], length: int) -> np.ndarray:
    """bool [layers, kv_heads, length]: the positions kept (the side's packbits hex)."""
    rows = [
        [np.unpackbits(np.frombuffer(bytes.fromhex(h), np.uint8))[:length] for h in layer["masks"]]
        for layer in layers
    ]
    return np.asarray(rows, dtype=bool)


@dataclass(frozen=True)
class PressRun:
    """One (press, ratio) of a side answer: kept [layers, kv_heads, context] and its extras."""

    press: str
    compression_ratio: float
    kept: np.ndarray
    ties: list  # per layer, per head: kvpress's cut score, tied, tied_kept, gap
    params: dict
    answer: str | None = None
    answer_ids: tuple = ()


def press_runs(answer: dict) -> dict[tuple[str, float], PressRun]:
    """(press, ratio) -> PressRun of every pressed run in a side answer ("kept"/"answer")."""
    length, out = answer["context_tokens"], {}
    for r in answer["runs"]:
        if r["press"] is None:
            continue
        layers = r["layers"]
        if not all(layer["gather_ok"] for layer in layers):
            raise KvpressError(f"{r['press']}: the kept indices do not gather what it kept")
        out[(r["press"], r["compression_ratio"])] = PressRun(
            r["press"], r["compression_ratio"], masks_of(layers, length),
            [layer.get("ties", []) for layer in layers], r.get("params", {}),
            r.get("answer"), tuple(r.get("answer_ids", ())),
        )  # fmt: skip
    return out


def full_answer(answer: dict) -> tuple[str, tuple]:
    """The uncompressed run's answer text and ids (mode "answer")."""
    r = next(r for r in answer["runs"] if r["press"] is None)
    return r["answer"], tuple(r["answer_ids"])


def load_dump(path: str | Path) -> dict[str, np.ndarray]:
    """The side's npz: scores per "Press@ratio" [layers, kv_heads, context] (float32), or the
    "logits" / "keys" of mode "logits"."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


# ---- the comparison -------------------------------------------------------------------------


def agreement(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """Per layer and KV head, how kvbench's kept set (bool [layers, kv_heads, context]) meets
    kvpress's: counts [layers, kv_heads] and the totals. `agree` is the share of kvpress's kept
    positions that kvbench keeps too (1.0: the same set, when both keep as many)."""
    if ours.shape != theirs.shape:
        raise ValueError(f"kept masks differ: kvbench {ours.shape}, kvpress {theirs.shape}")
    both = (ours & theirs).sum(-1)
    n_ours, n_theirs = ours.sum(-1), theirs.sum(-1)
    return {
        "n_kept_ours": n_ours,
        "n_kept_theirs": n_theirs,
        "only_ours": n_ours - both,
        "only_theirs": n_theirs - both,
        "agree": both / np.maximum(n_theirs, 1),
        "heads_equal": int(((ours == theirs).all(-1)).sum()),
        "heads": int(np.prod(ours.shape[:2])),
        "layers_equal": int(((ours == theirs).all((-1, -2))).sum()),
    }


def cut_of(scores: np.ndarray, n_kept: np.ndarray) -> np.ndarray:
    """The n_kept-th largest score per [layer, head] (the cut of a top-k keep)."""
    top = -np.sort(-scores, axis=-1)
    idx = np.clip(n_kept - 1, 0, scores.shape[-1] - 1)[..., None]
    return np.take_along_axis(top, idx, axis=-1)[..., 0]


CAUSES = ("kvpress_tie", "kvbench_tie", "near_tie", "unexplained")


def trace(ours: np.ndarray, theirs: np.ndarray, our_scores=None, their_scores=None,
          rel_tol: float = 1e-4) -> dict[str, int]:  # fmt: skip
    """Every position one side keeps and the other does not, by cause (CAUSES): a tie at
    kvpress's cut (its score equals the cut's and so does another position's), a tie at
    kvbench's cut, a near tie (on either side, its score and another's within rel_tol of that
    side's cut: the last bits of float32 differ between torch and MLX), or unexplained.
    Without kvpress's scores every difference is unexplained; without kvbench's, only
    kvpress's side is looked at."""
    diff = ours ^ theirs
    counts = dict.fromkeys(CAUSES, 0)
    if their_scores is None:
        counts["unexplained"] = int(diff.sum())
        return counts
    pairs = ((their_scores, theirs),) + (() if our_scores is None else ((our_scores, ours),))
    ties, near = [], np.zeros_like(diff)
    for s, kept in pairs:
        cut = cut_of(s, kept.sum(-1))[..., None]
        at = s == cut
        ties.append(at & (at.sum(-1, keepdims=True) >= 2))
        band = np.abs(s - cut) <= rel_tol * np.abs(cut)
        near |= band & (band.sum(-1, keepdims=True) >= 2)
    if our_scores is None:
        ties.append(np.zeros_like(diff))  # kvbench's ties: not known
    for cause, where in zip(CAUSES[:3], (ties[0], ties[1] & ~ties[0], near & ~ties[0] & ~ties[1])):
        counts[cause] = int((diff & where).sum())
    counts["unexplained"] = int(diff.sum()) - sum(counts[c] for c in CAUSES[:3])
    return counts


def close(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """How far two float arrays of the same tokens are apart (logits, keys): the largest
    absolute difference and the largest relative to theirs' largest magnitude."""
    a, b = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: kvbench {a.shape}, kvpress {b.shape}")
    err = float(np.abs(a - b).max())
    return {"max_abs": err, "max_rel": err / max(float(np.abs(b).max()), 1e-30)}


def same_argmax(ours_logits: np.ndarray, theirs_logits: np.ndarray) -> float:
    """Share of positions where both sides' logits pick the same next token."""
    return float((np.argmax(ours_logits, -1) == np.argmax(theirs_logits, -1)).mean())
