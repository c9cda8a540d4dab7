// kvbench flash-decode, Metal backend (mx.fast.metal_kernel). NOT RUN ON HARDWARE YET.
// Twin of kernels/cuda/flash_decode.cu: both are this backend prelude + the shared helpers
// (kernels/gpu/flash_decode_common.h) as the kernel header, and a short entry + the shared
// body (kernels/gpu/flash_decode_body.inc) as the kernel source. Only the prelude and the
// entry differ between backends; the algorithm text is one file.
// Launch (kernels/launch.py): grid counts THREADS: (THREADS * n_splits, B * Hkv, 1),
// threadgroup (THREADS, 1, 1); threadgroup memory <= 32 KB is checked before launch.

#define KV_FN inline
#define DEV_PTR device
#define TG_PTR threadgroup
#define TG_MEM threadgroup
#define BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define KV_EXP metal::exp
#define KV_FMAX metal::fmax
#define KV_NEG_INF (-INFINITY)
#define SCALE_T half

constant float FP4_MAGNITUDE[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Butterfly reductions over the 32 lanes of a simdgroup (fixed order: xor 16, 8, 4, 2, 1).
inline float lane_sum(float v) {
  for (ushort off = 16; off > 0; off >>= 1) {
    v += simd_shuffle_xor(v, off);
  }
  return v;
}

inline float lane_max(float v) {
  for (ushort off = 16; off > 0; off >>= 1) {
    v = metal::fmax(v, simd_shuffle_xor(v, off));
  }
  return v;
}

// ==== entry ====
  // one threadgroup = one (sequence, kv head, split)
  const int tid = int(thread_index_in_threadgroup);
  const int lane = int(thread_index_in_simdgroup);
  const int sg = int(simdgroup_index_in_threadgroup);
  const int split = int(threadgroup_position_in_grid.x);
  const int bh = int(threadgroup_position_in_grid.y);  // sequence * Hkv + kv head
