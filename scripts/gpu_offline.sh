#!/usr/bin/env bash
# `make gpu-verify` on an offline NVIDIA machine (Python 3.12 with numpy, pandas, scipy, pytest,
# the nvidia-* CUDA 13 libraries; no package registry) that receives at most 64 MiB per call, so
# MLX's CUDA wheel (~90 MB) comes in two calls made back to back on the same warm machine.
# Prepare here first: bash ../shared/gpu/prepare-mlx-cuda.sh, then put the other wheels the
# machine lacks (plotly, gguf, mlx-lm) into .gpuwhl-b/.
#   call 1 (carry .gpuwhl-a):  bash scripts/gpu_offline.sh a OUT
#   call 2 (carry .gpuwhl-b):  bash scripts/gpu_offline.sh b OUT [BUDGET_S] [SUITE]
# Stage a keeps the first half in /tmp/gw and records the machine; stage b rejoins the wheel,
# installs the wheels into the machine's own python (--no-index --no-deps) and runs
# scripts/gpu_verify.py --python current: GPU parity tests, the suite, the copy probe, the report.
set -uo pipefail
stage=${1:?stage a or b}
out=${2:?output directory}
budget_s=${3:-300}
suite=${4:-suites/gpu-decode.yaml}
mkdir -p "$out" /tmp/gw
{ date -u; nvidia-smi; python3 -V; command -v python3
  python3 -m pip list 2>/dev/null | grep -iE "^(numpy|pandas|scipy|pyyaml|pytest|narwhals|transformers|tokenizers|mlx)"
} > "$out/machine-$stage.txt" 2>&1
case "$stage" in
  a) cp .gpuwhl-a/part-a /tmp/gw/ && ls -la /tmp/gw ;;
  b) test -f /tmp/gw/part-a || { echo "gpu_offline: /tmp/gw/part-a is gone (a fresh machine): run stage a again" >&2; exit 3; }
     # kvbench itself, installed (a PYTHONPATH of the checkout has no `kvbench`: harness/ is it)
     python3 -m pip install -q --no-deps --no-index --no-build-isolation . || exit 4
     PYTHONUNBUFFERED=1 python3 scripts/gpu_verify.py --python current --wheels /tmp/gw \
       --wheels .gpuwhl-b --suite "$suite" --budget-s "$budget_s" --test-workers 8 --out "$out" ;;
  *) echo "gpu_offline: stage is a or b" >&2; exit 2 ;;
esac
