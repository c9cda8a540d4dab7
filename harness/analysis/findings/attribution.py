"""Topic "who lost the answer": per retrieval cell held against llama.cpp (task
passkey-llamacpp: one model, context, edit, depth and cache configuration), the answers of
kvbench's cache (float32 compute over it), of the same cache in llama.cpp's arithmetic (q_quant
q8_0 against a quantized K with the keys in llama.cpp's order, div_sign llama.cpp), of
llama-passkey on the GGUF as stored and on its float32 copy (peer_weights f32, the weights
kvbench runs) and of the float32 cache, and which part lost the answer: the context (the
float32 cache misses too: a shift discarded the key, or the model cannot read that far), the
cache (kvbench's format misses where the float32 cache finds it; the line says so where the
same cache finds it in llama.cpp's arithmetic), the arithmetic (kvbench finds it and misses in
llama.cpp's arithmetic), the peer's weights (llama-passkey misses on the GGUF and finds it on
the float32 copy) or llama.cpp (it misses on the weights and arithmetic kvbench finds it with).
Each line also says whether kvbench in llama.cpp's arithmetic gave llama-passkey's answer in
every trial [retrieval]. With more than one trial, each count carries its 95% Wilson
interval."""

from __future__ import annotations

import json
import re

import pandas as pd

from kvbench.analysis.findings.common import Finding, apart_text, group_axes, groups
from kvbench.analysis.findings.tasks import task_rows
from kvbench.stats import wilson

TOPIC = "who lost the answer"
TASK = "passkey-llamacpp"
SIDES = ("kvbench", "in llama.cpp's arithmetic", "llama-passkey", "llama-passkey f32 weights")


def side(r: dict) -> str:
    """Which of SIDES a row is."""
    if r.get("kernel") == "llama.cpp":
        return SIDES[3] if r.get("peer_weights") == "f32" else SIDES[2]
    named = r.get("q_quant") not in (None, "none") or r.get("k_order") == "gguf"
    return SIDES[1] if named or r.get("div_sign") == "llama.cpp" else SIDES[0]


def answers(r) -> list:
    """The number each trial's text starts its answer with (None: no digits)."""
    out = []
    for text in json.loads(r["answer_texts"]) if isinstance(r.get("answer_texts"), str) else []:
        m = re.search(r"\d+", text)
        out.append(m.group(0) if m else None)
    return out


def count(k: int, n: int) -> str:
    if n <= 1:
        return f"{k}/{n}"
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({lo:.2f}-{hi:.2f})"


def found(r: dict) -> bool:
    """The key found in every trial."""
    return int(r["n_correct"]) == int(r["n_trials"])


def verdict(by: dict, ref_ok: bool) -> str:
    """Which part lost the answer (module docstring), from each side's all-correct flag."""
    ok = {s: found(r) for s, r in by.items()}
    if not ref_ok:
        return "the context lost it (the float32 cache misses too)"
    if not ok.get(SIDES[0], True):
        if ok.get(SIDES[1]):  # the same cache, queries rounded to q8_0: the rounding kept it
            return ("the cache lost it under float32 queries (the float32 cache finds it; "
                    "in llama.cpp's arithmetic the same cache finds it)")  # fmt: skip
        return "the cache lost it (the float32 cache finds it)"
    if not ok.get(SIDES[1], True):
        return "the arithmetic lost it (kvbench finds it, in llama.cpp's arithmetic it misses)"
    if not ok.get(SIDES[2], True):
        return ("the peer's weights lost it (llama-passkey finds it on the float32 copy)"
                if ok.get(SIDES[3]) else "llama.cpp lost it")  # fmt: skip
    return "none lost it" if all(ok.values()) else "llama.cpp lost it on the float32 copy"


def sides(part: pd.DataFrame) -> dict | None:
    """A cell's rows by side, or None where it is not held against llama.cpp. A row with
    rounded queries whose keys are not in the order llama.cpp's row records is no twin of
    llama.cpp's arithmetic (suite/validate.py check_key_order refuses it now; older rows)."""
    rows = part.to_dict("records")
    orders = {r.get("k_order") for r in rows if r.get("kernel") == "llama.cpp"}
    rows = [r for r in rows if not (orders and r.get("q_quant") not in (None, "none")
                                    and r.get("k_order") not in orders)]  # fmt: skip
    by = {side(r): r for r in rows}
    if SIDES[2] not in by and SIDES[3] not in by or not ({SIDES[0], SIDES[1]} & set(by)):
        return None
    return by


def agreement(cells: list[dict]) -> str | None:
    """The done-when figure over every cell: kvbench in llama.cpp's arithmetic (its plain row
    where no query is rounded: an fp16 K) against llama-passkey on each weights, by verdict (the
    trials that found the key: the same count) and by the number each trial's answer starts
    with."""
    said = []
    for peer_side, weights in ((SIDES[2], "the GGUF"), (SIDES[3], "its float32 copy")):
        pairs = [(by.get(SIDES[1], by.get(SIDES[0])), by[peer_side]) for by in cells
                 if peer_side in by]  # fmt: skip
        if not pairs:
            continue
        verdicts = sum(int(own["n_correct"]) == int(peer["n_correct"]) for own, peer in pairs)
        numbers = sum(answers(own) == answers(peer) for own, peer in pairs)
        said.append(f"llama-passkey on {weights}: the same verdict in {verdicts} of {len(pairs)},"
                    f" the same number in {numbers} of {len(pairs)}")  # fmt: skip
    return "in llama.cpp's arithmetic kvbench against " + "; against ".join(said) if said else None


def line(part: pd.DataFrame) -> tuple[str, bool] | None:
    by = sides(part)
    if by is None:
        return None  # not a cell held against llama.cpp
    own = by.get(SIDES[0], by.get(SIDES[1]))
    n = int(own["n_trials"])
    ref_k = round(float(own["ref_accuracy"]) * n)
    said = [f"{s} {count(int(r['n_correct']), int(r['n_trials']))}" for s, r in by.items()]
    said.append(f"float32 cache {count(ref_k, n)}")
    peer = by.get(SIDES[3], by.get(SIDES[2]))
    named = by.get(SIDES[1])
    same = "" if named is None else (
        "; in llama.cpp's arithmetic kvbench gives llama-passkey's answer"
        if answers(named) == answers(peer) else "; in llama.cpp's arithmetic its answer differs"
    )  # fmt: skip
    return ", ".join(said) + f": {verdict(by, ref_k == n)}" + same, True


def find(cur: pd.DataFrame) -> list[Finding]:
    d = task_rows(cur, "retrieval", "n_correct", engines=False)  # a cell holds every side
    if d.empty or "task" not in d or not d["kernel"].eq("llama.cpp").any():
        return []
    d = d[d["task"].eq(TASK)]
    out, cells = [], []
    for values, part in groups(d, group_axes(d)):
        got = line(part)
        if got is None:
            continue
        cells.append(sides(part))
        first = part.iloc[0]
        edit = "" if first.get("kv_edit") in (None, "none") else f" {first['kv_edit']}"
        where = f"{TASK}{edit} depth {first['depth']:g}{apart_text(values, d)}"
        out.append(Finding(TOPIC, f"{where} {first['config']}: {got[0]}", "retrieval", got[1]))
    total = agreement(cells)
    if total:
        cells_text = f"{len(cells)} cell{'s' if len(cells) != 1 else ''}"
        out.insert(0, Finding(TOPIC, f"{cells_text}: {total}", "retrieval", True))
    return out
