"""Copy-bandwidth probe for `make gpu-verify`: how fast this device moves bytes, measured here.

A float32 buffer far larger than the last-level cache is copied (`x * 1.0`: reads N bytes and
writes N bytes, 2N counted) and summed (reads N bytes, the harness's read probe), each timed
with the harness's timer (eval + synchronize, warm-up, median of the samples). Writes JSON:
copy_gbps, read_gbps, the buffer size, and the device. SI units: 1 GB = 1e9 B.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx

from kvbench.run.bandwidth import DEFAULT_BYTES, PROBES, probe_gbps  # noqa: E402


def _mlx_copy(nbytes: int):
    x = mx.ones((nbytes // 4,), dtype=mx.float32)
    mx.eval(x)
    return lambda: x * 1.0  # a new array each call: N bytes read, N written


def measure(nbytes: int) -> dict:
    copy_gbps, n_copy = probe_gbps(_mlx_copy, nbytes)
    read_gbps, n_read = probe_gbps(PROBES["mx.sum"], nbytes)
    return {
        "copy_gbps": 2 * copy_gbps,  # probe_gbps counts nbytes once; a copy moves it twice
        "read_gbps": read_gbps,
        "buffer_bytes": nbytes,
        "samples": {"copy": n_copy, "read": n_read},
        "device": str(mx.default_device()),
        "device_info": {k: str(v) for k, v in mx.device_info().items()},
        "mlx": mx.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=None, help="buffer size (default per backend)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = ap.parse_args(argv)
    backend = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"
    result = measure(args.bytes or DEFAULT_BYTES[backend])
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
