// kvbench flash-decode: helpers shared VERBATIM by the Metal and CUDA kernels.
// The backend prelude (kernels/metal/flash_decode.metal, kernels/cuda/flash_decode.cu) defines
// KV_FN, DEV_PTR, TG_PTR, TG_MEM, BARRIER(), KV_EXP, KV_FMAX, KV_NEG_INF, SCALE_T, lane_sum, lane_max
// and FP4_MAGNITUDE; the wrapper (kernels/gpu_kernels.py) defines KV_CODE (0 dense, 1 fp4,
// 2 int4). Layouts: K/V rows [B*Hkv, L, D] (dense, T) or [B*Hkv, L, D/8] uint32 with element j
// of a word in bits 4j..4j+3 and float16 scales [B*Hkv, L, D/GS] (4-bit).

// One 4-bit code to its value before scaling. fp4 E2M1: code = sign<<3 | exp<<1 | mantissa,
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. int4: two's complement nibble in [-8, 7].
KV_FN float decode_nibble(uint32_t code, int kv_code) {
  if (kv_code == 1) {
    const float mag = FP4_MAGNITUDE[code & 7u];
    return (code & 8u) ? -mag : mag;
  }
  return float(int(code ^ 8u) - 8);
}

// The source pointers are template parameters (Src, Words, Scales), deduced at the call: Metal
// gets an input of fewer than 8 elements as `const constant T*`, larger ones as `const device
// T*` (MLX's metal_kernel), so a helper taking `const device T*` stops matching at tiny shapes.

// Dense tile: rows row0..row0+TILE_KV of src (this sequence and kv head) into dst [TILE_KV*D];
// rows at or past n_rows are zero-filled (their scores are masked to -inf).
template <typename T, int TILE_KV, int D, int THREADS, typename Src>
KV_FN void load_tile_dense(Src src, TG_PTR T* dst, size_t row0, int n_rows, int tid) {
  for (int e = tid; e < TILE_KV * D; e += THREADS) {
    const int r = e / D;
    dst[e] = (r < n_rows) ? src[(row0 + r) * D + e % D] : T(0.0f);
  }
}

// 4-bit tile, dequantized while loading (fused): one uint32 word (8 elements) per step.
template <typename T, int TILE_KV, int D, int GS, int THREADS, int CODE, typename Words,
          typename Scales>
KV_FN void load_tile_q4(
    Words src,  // uint32_t words
    Scales scales,  // SCALE_T
    TG_PTR T* dst,
    size_t row0,
    int n_rows,
    int tid) {
  constexpr int WORDS = D / 8;
  constexpr int GROUPS = D / GS;
  for (int w = tid; w < TILE_KV * WORDS; w += THREADS) {
    const int r = w / WORDS;
    const int c = w % WORDS;
    const bool valid = r < n_rows;
    const uint32_t word = valid ? src[(row0 + r) * WORDS + c] : 0u;
    for (int j = 0; j < 8; ++j) {
      const int d = c * 8 + j;
      const float s = valid ? float(scales[(row0 + r) * GROUPS + d / GS]) : 0.0f;
      dst[r * D + d] = T(decode_nibble((word >> (4 * j)) & 0xFu, CODE) * s);
    }
  }
}
