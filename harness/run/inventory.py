"""What `kvbench list` and `kvbench env` print."""

from __future__ import annotations

from kvbench.kernels.attention.registry import KERNELS, unsupported_reason
from kvbench.kernels.data import KV_DATA
from kvbench.kernels.formats.registry import FORMATS, get_format
from kvbench.kernels.stores.footprint import LAYOUTS
from kvbench.peers.registry import PEERS, missing_reason
from kvbench.run.bandwidth import peak_read_bandwidth
from kvbench.run.context import backend_name, run_context
from kvbench.suite.presets import PRESETS
from kvbench.suite.validate import DECODE_ORDERS, WORKLOADS


def inventory() -> str:
    backend = backend_name()
    lines = ["presets (n_layers, n_q_heads, n_kv_heads, head_dim; source):"]
    lines += [
        f"  {name:<15} {s.n_layers:>3} {s.n_q_heads:>3} {s.n_kv_heads:>3} {s.head_dim:>4}"
        f"  {s.source}"
        for name, s in PRESETS.items()
    ]
    lines.append("kv dtypes (stored bits per element at head_dim 128, scales included):")
    lines += [f"  {name:<10} {get_format(name).bits_per_elem(128):g}" for name in FORMATS]
    lines.append(f"kernels (on backend {backend}: formats each can run):")
    for name in KERNELS:
        ok = [f for f in FORMATS if unsupported_reason(name, get_format(f), backend) is None]
        lines.append(f"  {name:<16} {', '.join(ok) if ok else '(none on this backend)'}")
    lines.append(f"peer kernels (docs/peers.md; on backend {backend}):")
    for name, peer in PEERS.items():
        ok = ", ".join(f for f in peer.formats if f in FORMATS)
        ok = ok or f"({'/'.join(peer.formats)}: not among this build's kv dtypes)"
        where = None if backend in peer.backends else f"(runs on {'/'.join(peer.backends)})"
        lines.append(f"  {name:<16} {where or missing_reason(name) or ok}")
    lines.append(f"  {'llama.cpp':<16} {llamacpp_line()}")
    lines.append(f"kv data: {', '.join(KV_DATA)}")
    lines.append(f"layouts: {', '.join(LAYOUTS)}  (docs/streams.md, docs/layouts.md)")
    lines.append(f"workloads: {', '.join(WORKLOADS)}; decode orders: {', '.join(DECODE_ORDERS)}")
    return "\n".join(lines)


def environment() -> str:
    ctx = run_context()
    bw = peak_read_bandwidth(ctx["backend"])
    keys = (
        "device",
        "backend",
        "mlx_version",
        "kvbench_version",
        "schema_version",
        "commit",
        "dirty",
        "branch",
        "host",
        "os",
        "blas",
        "blas_source",
        "blas_gflops",
    )
    lines = [f"{k:<16} {ctx[k]}" for k in keys]
    lines.append(f"{'peak_read_gbps':<16} {bw['peak_gbps']:.1f}  ({bw['peak_method']})")
    lines.append(f"{'memory':<16} {memory_line()}")
    lines += [f"{'peer ' + name:<16} {why or 'ready'}" for name, why in peer_states().items()]
    return "\n".join(lines)


def llamacpp_line() -> str:
    """llama.cpp as a peer kernel (its own engine, harness/engines/llamacpp.py): the cache
    types it takes, or why its binaries are missing."""
    from kvbench.peers import llamacpp

    why = llamacpp.missing_reason("llama-perplexity")
    ok = ", ".join(f for f in FORMATS if llamacpp.cache_type(f) is not None)
    return why or f"{ok} (its own process: quality, bench and passkey rows, docs/peers.md)"


def peer_states() -> dict[str, str | None]:
    """Each peer: None when it can run here, else why not (a missing package or build)."""
    from kvbench.peers import llamacpp

    out = {name: missing_reason(name) for name in PEERS}
    out["llama.cpp"] = llamacpp.missing_reason("llama-perplexity")
    return out


def memory_line() -> str:
    """Total memory and what the memory guard would allow a case (harness/run/memory.py)."""
    from kvbench.run.memory import available_bytes

    total = None
    try:
        with open("/proc/meminfo") as f:
            total = next((int(x.split()[1]) * 1024 for x in f if x.startswith("MemTotal:")), None)
    except OSError:
        pass  # not Linux: the available figure below comes from MLX's device info
    got = available_bytes()
    avail = f"{got[0] / 2**30:.1f} GiB available ({got[1]})" if got else "available: unknown"
    return (f"{total / 2**30:.1f} GiB total, " if total else "") + avail
