"""`kvbench model fetch [NAME]`: download a real model into the kvbench cache."""

from __future__ import annotations

import argparse

from kvbench.errors import UserError

NAME = "model"


def add_parser(sub) -> argparse.ArgumentParser:
    model = sub.add_parser(NAME, help="real models for the quality and model_decode phases")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser("fetch", help="download a model into the kvbench cache")
    fetch.add_argument("name", nargs="?", default="smollm2-135m", help="(default smollm2-135m)")
    fetch.set_defaults(func=run_fetch)
    return model


def run_fetch(args) -> int:
    from kvbench.kernels.model.fetch import ModelFetchError, fetch_model

    try:
        print(fetch_model(args.name))
    except (ModelFetchError, KeyError) as e:  # a KeyError's str() is the repr of its text
        raise UserError(f"kvbench model fetch: {e.args[0] if e.args else e}") from None
    return 0
