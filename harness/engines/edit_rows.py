"""A context shift or self-extend on a model (suite/model_edit.py): its Schedule and the row
fields both model engines record (engines/model.py quality, engines/model_tasks.py retrieval)."""

from __future__ import annotations

from kvbench.case import Case
from kvbench.engines import common
from kvbench.kernels.model import shift
from kvbench.suite import model_edit


def schedule(name: str, edit: tuple) -> shift.Schedule:
    """The Schedule of an edit (model_edit.edit_of) on model `name`."""
    return model_edit.schedule_for(edit, name, *common.model_of(name))


def edit_fields(edits: list[dict]) -> dict:
    """A row's evidence of the edit: context shifts made (all trials), the largest position
    RoPE gave an answer token (n_past), the context's cells, keys re-rotated (all trials)."""
    if not edits:
        return {}
    return {
        "kv_shifts": sum(e["context_shifts"] for e in edits),
        "n_past": max(e["n_past"] for e in edits),
        "cells_alloc": edits[0]["cells"],
        "edit_units": sum(e["rotated"] for e in edits),
    }


def edit_effective(case: Case) -> tuple[dict, int | None]:
    """An edited case's n_keep in effect (a null one: the instruction's tokens) and the
    positions its cache holds at most (the context's cells); ({}, None) without an edit."""
    edit = model_edit.edit_of(case)
    if edit is None:
        return {}, None
    sch = schedule(case.model, edit)
    return {"n_keep": sch.n_keep}, min(case.context_len, sch.n_cells)


def edit_ubatch(case: Case) -> int:
    """The row's ubatch: an edit reads passkey.cpp's batches of ga_w in micro-batches of at
    most UBATCH, so one forward pass takes at most the smaller."""
    edit = model_edit.edit_of(case)
    n = common.ubatch_of(case)
    return n if edit is None else min(n, schedule(case.model, edit).n_batch)
