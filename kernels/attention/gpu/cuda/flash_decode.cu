// kvbench flash-decode, CUDA backend (mx.fast.cuda_kernel). NOT RUN ON HARDWARE YET.
// Twin of kernels/metal/flash_decode.metal: each kernel is this backend prelude + the shared
// helpers (kernels/gpu/flash_decode_common.h) as the kernel header, and a short entry + a shared
// body (kernels/gpu/flash_decode_body.inc: the split kernel; flash_decode_combine.inc: the
// combine) as the kernel source. Only the prelude and the entries differ between backends.
// Launch (kernels/launch.py): grid counts THREADS (MLX divides it by the block size).
// Split kernel: grid (THREADS * n_splits, B * Hkv, 1), block (THREADS, 1, 1).
// Combine: grid (32, B * Hq, 1), block (32, 1, 1).

#define KV_FN __device__ __forceinline__
#define DEV_PTR
#define TG_MEM __shared__
#define BARRIER() __syncthreads()
#define KV_EXP expf
#define KV_FMAX fmaxf
// MLX >= 0.32 no longer defines `inf` for custom kernels: build -inf from its bits.
#define KV_NEG_INF __uint_as_float(0xFF800000u)
#define KV_UNROLL _Pragma("unroll")

KV_FN float bits_to_float(uint32_t w) {
  return __uint_as_float(w);
}

// Element j (0 low half, 1 high half) of a word of two 16-bit values.
KV_FN float elem_of(uint32_t w, int j, __half tag) {
  return __half2float(__ushort_as_half((unsigned short)(j ? (w >> 16) : (w & 0xFFFFu))));
}

KV_FN float elem_of(uint32_t w, int j, __nv_bfloat16 tag) {
  return __uint_as_float(j ? (w & 0xFFFF0000u) : (w << 16));
}

// One butterfly step over the 32 lanes of a warp; every lane calls it (full mask).
KV_FN float lane_xor(float v, int off) {
  return __shfl_xor_sync(0xFFFFFFFFu, v, off);
}

// Quantize-on-write (kv_encode_common.h): float32 steps rounded as MLX's separate ops round
// them (IEEE, round to nearest even; never contracted into an fma), float16 conversion.
#define KV_FABS fabsf
#define KV_FMIN fminf
#define KV_RINT rintf
#define KV_FLOOR floorf
#define KV_ROUND roundf

KV_FN uint32_t float_bits(float x) {
  return __float_as_uint(x);
}

KV_FN float div_rn(float a, float b) {
  return __fdiv_rn(a, b);
}

KV_FN float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}

KV_FN float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}

KV_FN __half half_of(float x) {
  return __float2half_rn(x);
}

KV_FN float half_value(__half h) {
  return __half2float(h);
}

// ==== entry ====
  // one block = one (sequence x kv head, split)
  const int tid = int(threadIdx.x);
  const int lane = int(threadIdx.x % 32);
  const int sg = int(threadIdx.x / 32);
  const int split = int(blockIdx.x);
  const int bh = int(blockIdx.y);  // sequence * Hkv + kv head
// ==== combine entry ====
  // one block = one warp = one output row (sequence x query head)
  const int lane = int(threadIdx.x % 32);
  const int row = int(blockIdx.y);
// ==== encode entry ====
  // one thread = one unit (GS elements of one row); grid y: 0 K, 1 V
  const int unit = int(blockIdx.x * blockDim.x + threadIdx.x);
  const int which = int(blockIdx.y);
