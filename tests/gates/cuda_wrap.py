"""The source and NVRTC options of a `mx.fast.cuda_kernel` call, as MLX 0.32 builds them.

Mirrors (our own code; written from reading MLX v0.32.x, not copied):
- mlx/backend/cuda/custom_kernel.cpp `build_kernel()`: MLX's default header (utils.cuh and
  cooperative_groups.h), the user header, `namespace mlx::core::cu {` with `namespace cg`, a
  `__global__ void custom_kernel_<name><template hash>(` signature: each input as
  `const <cuda type>* name` followed by `const __grid_constant__ Shape name_shape` / `Strides
  name_strides` / `int name_ndim` when the source mentions them (and the input has ndim > 0),
  each output as `<cuda type>* name`; then one `constexpr int X = v;` / `constexpr bool` /
  `using T = <cuda type>;` line per template argument, a blank line, the source, and `}`.
- `template_arguments_hash()` (`_<int>`, `_t`/`_f`, `_<type string>`) for the kernel name,
  and `dtype_to_cuda_type()` (mlx/backend/cuda/utils.cpp) / `get_type_string()`
  (mlx/backend/common/compiled.cpp) for the type names.
- mlx/backend/cuda/jit_module.cpp `compile()`: options `--device-as-default-execution-space`,
  `--gpu-architecture=sm_<cc>` with an `a` suffix from compute capability 9 on (SASS: NVRTC
  13 supports every device), `--include-path=` mlx/include, mlx/include/cccl and the
  nvidia/cu13/include of the runtime wheel; the device headers passed in memory under their
  include names; the kernel registered as the name expression `mlx::core::cu::<name>`.
The wrapper strings are checked against the wheel's libmlx.so (mlx_wheel.WRAPPER_FRAGMENTS).
"""

from __future__ import annotations

from dataclasses import dataclass

CUDA_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "float32": "float", "float64": "double",
}  # fmt: skip
TYPE_STRINGS = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t"}
DEFAULT_HEADER = (
    '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
)
ARCHS = {"sm_80": (8, 0), "sm_90a": (9, 0)}  # A100 and H100/H200; `a` from cc 9 on


def dtype_name(dtype) -> str:
    """'float16' for mx.float16 (str(mx.float16) is 'mlx.core.float16')."""
    return str(dtype).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Call:
    """One cuda_kernel launch as recorded: what MLX needs to build its source."""

    name: str
    header: str
    source: str
    input_names: tuple[str, ...]
    inputs: tuple[tuple[str, int, int], ...]  # (dtype name, ndim, size) per input
    output_names: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    template: tuple[tuple[str, object], ...]  # value: int, bool or dtype name


def _template_hash(template) -> str:
    out = ""
    for _, v in template:
        if isinstance(v, bool):
            out += "_t" if v else "_f"
        elif isinstance(v, int):
            out += f"_{v}"
        else:
            out += "_" + TYPE_STRINGS.get(v, v)
    return out


def kernel_name(call: Call) -> str:
    return "custom_kernel_" + call.name + _template_hash(call.template)


def _signature(call: Call) -> str:
    lines = []
    for name, (dtype, ndim, _) in zip(call.input_names, call.inputs):
        lines.append(f"    const {CUDA_TYPES[dtype]}* {name},\n")
        extras = (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int"))
        for suffix, ctype in extras if ndim > 0 else ():
            if name + suffix in call.source:
                lines.append(f"    const __grid_constant__ {ctype} {name}{suffix},\n")
    outs = [f"    {CUDA_TYPES[d]}* {n}" for n, d in zip(call.output_names, call.output_dtypes)]
    return "".join(lines) + ",\n".join(outs) + ") {\n"


def _template_lines(template) -> str:
    if not template:
        return ""
    out = ""
    for name, v in template:
        if isinstance(v, bool):
            out += f"  constexpr bool {name} = {str(v).lower()};\n"
        elif isinstance(v, int):
            out += f"  constexpr int {name} = {v};\n"
        else:
            out += f"  using {name} = {CUDA_TYPES[v]};\n"
    return out + "\n"


def build_source(call: Call) -> str:
    """The exact text MLX 0.32 hands to nvrtcCreateProgram for this call."""
    return (
        DEFAULT_HEADER
        + call.header
        + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
        + f"__global__ void {kernel_name(call)}(\n"
        + _signature(call)
        + _template_lines(call.template)
        + call.source
        + "\n}\n\n} // namespace mlx::core::cu\n"
    )


def options(arch: str, include_dirs: list[str]) -> list[str]:
    major, minor = ARCHS[arch]
    tag = "a" if major >= 9 else ""
    return [
        "--device-as-default-execution-space",
        f"--gpu-architecture=sm_{major}{minor}{tag}",
        *[f"--include-path={d}" for d in include_dirs],
    ]
