"""Multi-sequence workloads: the history of batches that fills a layout before the timed step.

A workload is n_seqs sequences of context_len tokens each at the timed step (the step decodes
token context_len - 1 of every sequence, as the cache engine's decode does):
* prefix_len > 0: one prompt of prefix_len tokens, written once and held by every sequence
  (llama.cpp: decode it for one sequence, seq_cp to the others; per-stream copies it into
  every stream); then each sequence generates its own continuation.
  prefix_len == 0: independent prompts, nothing shared.
* order "interleaved": generation runs in rounds, each round one batch of one token of every
  sequence; "sequential": one sequence generates all its tokens, then the next.
* churn c: sequences 0..c-1 finish after 3/4 of their T = context_len - 1 - prefix_len
  generated tokens; their own cells are freed (seq_rm from prefix_len: the shared prefix stays,
  as llama.cpp's server keeps a cached prompt) and a new sequence starts in the same slot,
  re-using the prefix and generating the remaining T - 3T//4 tokens. Freed cells that are not
  refilled stay as holes below the last used cell.
Every generated token gets a new token id (its own K/V), so diverged sequences never share K/V
even at equal positions; only the prefix's token ids are common.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.kernels.stores.layouts import Layout, pad_to
from kvbench.kernels.stores.paged import PagedLayout, blocks_for

ORDERS = ("interleaved", "sequential")


@dataclass(frozen=True)
class Workload:
    n_seqs: int
    context_len: int
    prefix_len: int = 0
    order: str = "interleaved"
    churn: int = 0

    def __post_init__(self):
        if not 0 <= self.prefix_len < self.context_len:
            raise ValueError(f"prefix_len {self.prefix_len} must be < context_len")
        if self.order not in ORDERS:
            raise ValueError(f"unknown order {self.order!r}; known: {', '.join(ORDERS)}")
        if not 0 <= self.churn <= self.n_seqs:
            raise ValueError(f"churn {self.churn} must be between 0 and n_seqs")
        if self.churn and self.gen_len < 4:
            raise ValueError("churn needs at least 4 generated tokens per sequence")

    @property
    def gen_len(self) -> int:
        """Tokens each sequence generates after the prefix, before the timed step."""
        return self.context_len - 1 - self.prefix_len

    @property
    def n_tokens(self) -> int:
        """Token ids a replay hands out: the prefix, every generated token, the step's."""
        return self.prefix_len + self.n_seqs * (self.gen_len + 1)

    @property
    def finish_at(self) -> int:
        """Generated tokens after which a churned sequence finishes."""
        return 3 * self.gen_len // 4


@dataclass
class Replay:
    """What replaying a workload into a layout left: per sequence, its tokens in position order
    (the timed step's token last) and the step token's (stream, cell)."""

    seq_tokens: list[list[int]]
    step_slots: list[tuple[int, int]]
    n_tokens: int  # token ids handed out (K/V rows the data table needs)
    freed: int = 0  # cells freed by churn


def replay(w: Workload, layout: Layout | PagedLayout) -> Replay:
    """Apply the workload's batches to `layout` (metadata only), then the timed step's batch."""
    counter = iter(range(1 << 62))
    prefix = [next(counter) for _ in range(w.prefix_len)]
    own: list[list[int]] = [[] for _ in range(w.n_seqs)]
    every = tuple(range(w.n_seqs))
    if prefix:
        layout.add([(every, p, t) for p, t in enumerate(prefix)])
    freed = 0

    def gen(seqs: list[int]) -> None:
        batch = []
        for s in seqs:
            tok = next(counter)
            batch.append(((s,), w.prefix_len + len(own[s]), tok))
            own[s].append(tok)
        layout.add(batch)

    def finish(s: int) -> None:
        nonlocal freed
        freed += layout.remove(s, w.prefix_len)
        own[s].clear()

    victims = range(w.churn)
    if w.order == "interleaved":
        for r in range(w.gen_len):
            if r == w.finish_at:
                for s in victims:
                    finish(s)
            gen(list(every))
    else:
        for s in every:
            for _ in range(w.finish_at if s in victims else w.gen_len):
                gen([s])
        for s in victims:
            finish(s)
        for s in victims:
            for _ in range(w.gen_len - w.finish_at):
                gen([s])
    step = [((s,), w.prefix_len + len(own[s]), next(counter)) for s in every]
    slots = [sl[0] for sl in layout.add(step)]
    seq_tokens = [prefix + own[s] + [step[s][2]] for s in every]
    assert step[-1][2] + 1 == w.n_tokens
    return Replay(seq_tokens, slots, n_tokens=w.n_tokens, freed=freed)


def stream_size(w: Workload, kind: str, pad: int) -> int:
    """Cells per stream: per-stream: the longest sequence (context_len), padded; unified: the
    most cells the workload ever holds at once, padded (the smallest unified cache that runs
    it), found by a dry run on a unified layout large enough for anything."""
    if kind == "per-stream":
        return pad_to(w.context_len, pad)
    dry = Layout("unified", w.n_seqs, w.n_seqs * w.context_len, pad)
    replay(w, dry)
    return pad_to(dry.peak_used, pad)


def build_layout(w: Workload, kind: str, pad: int) -> tuple[Layout, Replay]:
    layout = Layout(kind, w.n_seqs, stream_size(w, kind, pad), pad)
    return layout, replay(w, layout)


def build_paged(w: Workload, page_size: int) -> tuple[PagedLayout, Replay]:
    """A page pool of the most pages the workload ever holds at once (found by a dry run on a
    pool large enough for anything: the smallest pool that runs it, as unified is sized), and
    the workload replayed into it."""
    roomy = 2 * w.n_seqs * (blocks_for(w.context_len, page_size) + 1)
    dry = PagedLayout(w.n_seqs, page_size, roomy)
    replay(w, dry)
    layout = PagedLayout(w.n_seqs, page_size, dry.peak_pages)
    return layout, replay(w, layout)
