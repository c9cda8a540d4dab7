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
