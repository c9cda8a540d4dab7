// kvbench flash-decode, CUDA backend (mx.fast.cuda_kernel). NOT RUN ON HARDWARE YET.
// Twin of kernels/metal/flash_decode.metal: both are this backend prelude + the shared helpers
// (kernels/gpu/flash_decode_common.h) as the kernel header, and a short entry + the shared
// body (kernels/gpu/flash_decode_body.inc) as the kernel source. Only the prelude and the
// entry differ between backends; the algorithm text is one file.
// Launch (kernels/launch.py): grid counts THREADS (MLX divides it by the block size):
// (THREADS * n_splits, B * Hkv, 1), block (THREADS, 1, 1); static shared memory <= 48 KB.

#define KV_FN __device__ inline
#define DEV_PTR
#define TG_PTR
#define TG_MEM __shared__
#define BARRIER() __syncthreads()
#define KV_EXP expf
#define KV_FMAX fmaxf
// MLX >= 0.32 no longer defines `inf` for custom kernels; cuda/std/limits comes with MLX's
// utils.cuh (its default header)
#define KV_NEG_INF (-cuda::std::numeric_limits<float>::infinity())
#define SCALE_T __half

__device__ const float FP4_MAGNITUDE[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Butterfly reductions over the 32 lanes of a warp (fixed order: xor 16, 8, 4, 2, 1).
__device__ inline float lane_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, off);
  }
  return v;
}

__device__ inline float lane_max(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  }
  return v;
}

// ==== entry ====
  // one block = one (sequence, kv head, split)
  const int tid = int(threadIdx.x);
  const int lane = int(threadIdx.x % 32);
  const int sg = int(threadIdx.x / 32);
  const int split = int(blockIdx.x);
  const int bh = int(blockIdx.y);  // sequence * Hkv + kv head
