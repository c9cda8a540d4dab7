// kvbench flash-decode, Metal backend (mx.fast.metal_kernel). NOT RUN ON HARDWARE YET.
// Twin of kernels/cuda/flash_decode.cu: each kernel is this backend prelude + the shared
// helpers (kernels/gpu/flash_decode_common.h) as the kernel header, and a short entry + a shared
// body (kernels/gpu/flash_decode_body.inc: the split kernel; flash_decode_combine.inc: the
// combine) as the kernel source. Only the prelude and the entries differ between backends.
// Launch (kernels/launch.py): grid counts THREADS (dispatchThreads).
// Split kernel: grid (THREADS * n_splits, B * Hkv, 1), threadgroup (THREADS, 1, 1).
// Combine: grid (32, B * Hq, 1), threadgroup (32, 1, 1).

#define KV_FN inline
#define DEV_PTR device
#define TG_MEM threadgroup
#define BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define KV_EXP metal::exp
#define KV_FMAX metal::fmax
#define KV_NEG_INF (-INFINITY)
#define KV_UNROLL _Pragma("clang loop unroll(full)")

KV_FN float bits_to_float(uint32_t w) {
  return as_type<float>(w);
}

// Element j (0 low half, 1 high half) of a word of two 16-bit values.
KV_FN float elem_of(uint32_t w, int j, half tag) {
  return float(as_type<half>(ushort(j ? (w >> 16) : (w & 0xFFFFu))));
}

KV_FN float elem_of(uint32_t w, int j, bfloat16_t tag) {
  return as_type<float>(j ? (w & 0xFFFF0000u) : (w << 16));
}

// One butterfly step over the 32 lanes of a simdgroup; every lane calls it.
KV_FN float lane_xor(float v, int off) {
  return simd_shuffle_xor(v, ushort(off));
}

// Quantize-on-write (kv_encode_common.h): float32 steps rounded as MLX's separate ops round
// them (IEEE, round to nearest even; MLX compiles with MathModeSafe), float16 conversion.
// NOT RUN: whether Metal contracts add_rn(mul_rn(..)) into an fma is for a device to show
// (tests/test_gpu_parity.py's encode test compares every byte with the MLX ops there).
#define KV_FABS metal::fabs
#define KV_FMIN metal::fmin
#define KV_RINT metal::rint
#define KV_FLOOR metal::floor
#define KV_ROUND metal::round

KV_FN uint32_t float_bits(float x) {
  return as_type<uint32_t>(x);
}

KV_FN float div_rn(float a, float b) {
  return a / b;
}

KV_FN float mul_rn(float a, float b) {
  return a * b;
}

KV_FN float add_rn(float a, float b) {
  return a + b;
}

KV_FN half half_of(float x) {
  return half(x);
}

KV_FN float half_value(half h) {
  return float(h);
}

// ==== entry ====
  // one threadgroup = one (sequence x kv head, split)
  const int tid = int(thread_index_in_threadgroup);
  const int lane = int(thread_index_in_simdgroup);
  const int sg = int(simdgroup_index_in_threadgroup);
  const int split = int(threadgroup_position_in_grid.x);
  const int bh = int(threadgroup_position_in_grid.y);  // sequence * Hkv + kv head
// ==== combine entry ====
  // one threadgroup = one simdgroup = one output row (sequence x query head)
  const int lane = int(thread_index_in_simdgroup);
  const int row = int(threadgroup_position_in_grid.y);
// ==== encode entry ====
  // one thread = one unit (GS elements of one row); grid y: 0 K, 1 V
  const int unit = int(thread_position_in_grid.x);
  const int which = int(thread_position_in_grid.y);
