// The CPU simulation's backend prelude (what kernels/attention/gpu/metal/flash_decode.metal and
// cuda/flash_decode.cu define above `// ==== entry ====`), for C++20 on the host: every GPU
// thread a std::thread, threadgroup memory a static array, BARRIER() a std::barrier, each
// simdgroup shuffle an exchange buffer between two barriers of the simdgroup. Included by
// flash_decode_sim.cpp (the whole kernel) and decode_check.cpp (the decode helpers alone).
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#define KV_FN inline
#define DEV_PTR
#define TG_MEM static
#define BARRIER() g_tg_barrier->arrive_and_wait()
#define KV_EXP std::exp
#define KV_FMAX std::fmax
#define KV_NEG_INF (-INFINITY)
#define KV_UNROLL

struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
  uint32_t x, y;
};

inline float bits_to_float(uint32_t w) {
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

inline float elem_of(uint32_t w, int j, _Float16 tag) {
  const uint16_t bits = uint16_t(j ? (w >> 16) : (w & 0xFFFFu));
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return float(h);
}

// Quantize-on-write (kv_encode_common.h): IEEE float32 steps (the build passes
// -ffp-contract=off, so add_rn(mul_rn(..)) is never one fma), float16 by _Float16 (nearest even).
#define KV_FABS std::fabs
#define KV_FMIN std::fmin
#define KV_RINT std::rint
#define KV_FLOOR std::floor
#define KV_ROUND std::round

inline uint32_t float_bits(float x) {
  uint32_t w;
  std::memcpy(&w, &x, 4);
  return w;
}

inline float div_rn(float a, float b) {
  return a / b;
}

inline float mul_rn(float a, float b) {
  return a * b;
}

inline float add_rn(float a, float b) {
  return a + b;
}

inline _Float16 half_of(float x) {
  return _Float16(x);
}

inline float half_value(_Float16 h) {
  return float(h);
}

static std::unique_ptr<std::barrier<>> g_tg_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_simd_barrier;
static float g_exchange[32][32];  // [simdgroup][lane]
thread_local int t_lane, t_sg;

inline float lane_xor(float v, int off) {
  g_exchange[t_sg][t_lane] = v;
  g_simd_barrier[t_sg]->arrive_and_wait();
  const float other = g_exchange[t_sg][t_lane ^ off];
  g_simd_barrier[t_sg]->arrive_and_wait();
  return other;
}
