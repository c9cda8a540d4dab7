// kvbench quantize-on-write: helpers shared VERBATIM by the Metal and CUDA encode kernels (and
// the CPU sim, tests/cpu_sim/kv_encode_sim.cpp). Header = `#define ENC_CODE n` + the backend
// prelude (above `// ==== entry ====` in flash_decode.metal / flash_decode.cu: KV_FN, the
// rounding helpers div_rn / mul_rn / add_rn, half_of / half_value, float_bits, bits_to_float
// and the KV_RINT / KV_FLOOR / KV_ROUND / KV_FABS / KV_FMAX / KV_FMIN macros) + this file.
// Each helper reproduces one MLX-ops encoder of kernels/formats/ step by step in float32, so
// the codes and scales are bit for bit the ones those encoders store (tests/test_kv_encode.py).
// Helpers take values, never pointers (Metal address spaces: see flash_decode_common.h).

#define ENC_FP4 1  // quant.py Scaled("fp4"): scale absmax / 6, E2M1 codes, ties to even
#define ENC_INT4 2  // quant.py Scaled("int4"): scale absmax / 7, round half to even, [-8, 7]
#define ENC_Q4_0 3  // ggml.py q4_0: d = signed extreme / -8, q = floor(x * (1/d) + 8.5)
#define ENC_Q8_0 4  // ggml.py q8_0: d = absmax / 127, q = roundf(x * (1/d))
#define ENC_FP8_E4M3 5  // fp8.py encode_codes: x / head scale, nearest, saturating
#define ENC_FP8_E5M2 6

// E2M1 code of y (already divided by the scale): |y| against the midpoints of the magnitudes
// 0, .5, 1, 1.5, 2, 3, 4, 6; a tie goes to the even code (strict > after an even code, >=
// after an odd one), the sign bit from y's own sign bit (-0.0 gives code 8), as fp4_codes.
KV_FN uint32_t fp4_code(float y) {
  const float a = KV_FABS(y);
  uint32_t mag = (a > 0.25f ? 1u : 0u) + (a >= 0.75f ? 1u : 0u) + (a > 1.25f ? 1u : 0u) +
      (a >= 1.75f ? 1u : 0u) + (a > 2.5f ? 1u : 0u) + (a >= 3.5f ? 1u : 0u) +
      (a > 5.0f ? 1u : 0u);
  return mag | ((float_bits(y) >> 31) << 3);
}

// Two's-complement nibble of clip(rint(y), -8, 7) (int4_codes: mx.round is half to even).
KV_FN uint32_t int4_code(float y) {
  const float r = KV_FMIN(KV_FMAX(KV_RINT(y), -8.0f), 7.0f);
  return uint32_t(int(r)) & 0xFu;
}

// ggml.py _inverse: 1/d in float32, 0 for d = 0.
KV_FN float inverse_of(float d) {
  return d == 0.0f ? 0.0f : div_rn(1.0f, d);
}

// fp8.py encode_codes for one value: round |y| to the FP8 grid of its binade (the ulp a power
// of two, so a / ulp and the product are exact; rint: ties to even), saturate to the largest
// finite value, then the code's exponent and mantissa fields from the float32 bits of the
// result (subnormals: v / 2^(e_min - m) as an integer); NaN gives 0x7F.
// E4M3: 3 mantissa bits, bias 7, max 448; E5M2: 2 mantissa bits, bias 15, max 57344.
KV_FN uint32_t fp8_code(float y, int m_bits, int bias, float top) {
  if (y != y) {
    return 0x7Fu;
  }
  const float a = KV_FABS(y);
  const int e_min = 1 - bias;
  int e = int((float_bits(a) >> 23) & 0xFFu) - 127;
  e = e > e_min ? e : e_min;
  const float ulp = bits_to_float(uint32_t(e - m_bits + 127) << 23);
  const float v = KV_FMIN(mul_rn(KV_RINT(div_rn(a, ulp)), ulp), top);
  const uint32_t vb = float_bits(v);
  const int ev = int((vb >> 23) & 0xFFu) - 127;
  const uint32_t mant = (vb >> (23 - m_bits)) & ((1u << m_bits) - 1u);
  const uint32_t normal = (uint32_t(ev + bias) << m_bits) | mant;
  // below the smallest normal: v / 2^(e_min - m), an integer (converted only there: above it
  // the product can pass the int range)
  const float to_sub = bits_to_float(uint32_t(bias - 1 + m_bits + 127) << 23);
  const bool is_normal = v >= bits_to_float(uint32_t(e_min + 127) << 23);
  const uint32_t mag = is_normal ? normal : uint32_t(int(mul_rn(v, to_sub)));
  return ((float_bits(y) >> 31) << 7) | (mag & 0x7Fu);
}
