"""Engines: the code that builds one case into timed stages (harness/engines/contract.py).

ENGINES is tried in order; the first engine whose `claims(case)` is true runs the case. Adding
an engine = a module with `claims`, `skip_reason` and `build`, and one line here. Every build's
State carries the case resolved once (`carrying`: suite/resolved.py), which the runner reads.
"""

from __future__ import annotations

from kvbench.case import Case
from kvbench.engines import (
    cache,
    edits,
    llamacpp,
    model,
    model_tasks,
    paged,
    peers,
    serve,
    sharded,
    streams,
    window,
)
from kvbench.engines.contract import Engine, carrying

ENGINES: dict[str, Engine] = {
    "llama.cpp": Engine(llamacpp.claims, llamacpp.skip_reason, carrying(llamacpp.build)),
    "serve": Engine(serve.claims, serve.skip_reason, carrying(serve.build)),
    "model-tasks": Engine(model_tasks.claims, model_tasks.skip_reason, carrying(model_tasks.build)),
    "model": Engine(model.claims, model.skip_reason, carrying(model.build)),
    "peers": Engine(peers.claims, peers.skip_reason, carrying(peers.build)),
    "edits": Engine(edits.claims, edits.skip_reason, carrying(edits.build)),
    "paged": Engine(paged.claims, paged.skip_reason, carrying(paged.build)),
    "window": Engine(window.claims, window.skip_reason, carrying(window.build)),
    "streams": Engine(streams.claims, streams.skip_reason, carrying(streams.build)),
    "sharded": Engine(sharded.claims, sharded.skip_reason, carrying(sharded.build)),
    "cache": Engine(cache.claims, cache.skip_reason, carrying(cache.build)),
}


def engine_for(case: Case) -> Engine:
    return next(e for e in ENGINES.values() if e.claims(case))


def skip_reason(case: Case, backend: str) -> str | None:
    return engine_for(case).skip_reason(case, backend)
