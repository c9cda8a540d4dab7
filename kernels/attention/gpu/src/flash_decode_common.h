// kvbench flash-decode: helpers shared VERBATIM by the Metal and CUDA kernels (and the CPU sim).
// The backend prelude (kernels/metal/flash_decode.metal, kernels/cuda/flash_decode.cu) defines
// KV_FN, DEV_PTR, TG_MEM, BARRIER(), KV_EXP, KV_FMAX, KV_NEG_INF, KV_UNROLL, lane_xor (a
// butterfly shuffle), bits_to_float, elem_of (2-byte dtypes) and the vector types uint2 / uint4;
// the wrapper (kernels/attention/gpu/kernels.py) defines KV_CODE (the codes below, as
// kernels/attention/gpu/launch.py KV_CODES numbers them).
// Every helper here takes VALUES, never pointers: the body indexes the inputs itself, so a
// helper can never mismatch the address space MLX gives an input (Metal passes an input of
// fewer than 8 elements as `constant`, larger ones as `device`).

// The 16-byte / 8-byte / 4-byte vector a lane loads in one instruction, by its size in bytes.
template <int BYTES>
struct VecOf;
template <>
struct VecOf<16> {
  typedef uint4 type;
};
template <>
struct VecOf<8> {
  typedef uint2 type;
};
template <>
struct VecOf<4> {
  typedef uint32_t type;
};

// Word i (32 bits) of a loaded vector; i is a compile-time constant after unrolling.
KV_FN uint32_t word_of(uint4 v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}
KV_FN uint32_t word_of(uint2 v, int i) {
  return i == 0 ? v.x : v.y;
}
KV_FN uint32_t word_of(uint32_t v, int i) {
  return v;
}

// Element j of a 32-bit word of float32 storage (one element per word); the 2-byte dtypes'
// overloads (two elements per word, element 0 in the low half) are in the backend prelude.
KV_FN float elem_of(uint32_t w, int j, float tag) {
  return bits_to_float(w);
}

// fp4 E2M1 magnitudes x2 as a register table: nibble c (0..7) of 0xC8643210 is 2*|value(c)|
// for |value| 0, 0.5, 1, 1.5, 2, 3, 4, 6. The factor 1/2 is folded into the group scale.
#define FP4_MAG2_TABLE 0xC8643210u

// How a stored row is decoded (KV_CODE). 1, 2, 5: 4-bit codes (8 per 32-bit word) with a
// float16 scale per group; 3, 4: one FP8 byte per element (4 per word) with a float32 scale
// per KV head (kernels/formats/fp8.py: a per-tensor scale arrives repeated per head); 6, 7:
// TurboQuant mse, 4-bit (8 per word) or 2-bit (16 per word) Lloyd-Max codes of the rotated row
// with its float16 norm as the one scale of the row (q arrives rotated: kernels.py).
#define KV_DENSE 0
#define KV_FP4 1
#define KV_INT4 2
#define KV_FP8_E4M3 3
#define KV_FP8_E5M2 4
#define KV_IQ4_NL 5
#define KV_TQ4_MSE 6
#define KV_TQ2_MSE 7
#define KV_IS_FP8(c) ((c) == KV_FP8_E4M3 || (c) == KV_FP8_E5M2)

// TurboQuant code c to its centroid (the Lloyd-Max codebook of the row's bit width and
// head_dim, divided by sqrt(head_dim): kernels/formats/turbo.py). The wrapper writes the 2^b
// centroids into this kernel's header as TQ_C0, TQ_C1, .. (float literals, exact float32) and
// defines TQ_CODEBOOK; a select tree over the code's bits, no memory table.
#ifdef TQ_CODEBOOK
KV_FN float tq_value(uint32_t c) {
#if KV_CODE == KV_TQ2_MSE
  return (c & 2u) ? ((c & 1u) ? TQ_C3 : TQ_C2) : ((c & 1u) ? TQ_C1 : TQ_C0);
#else
  const bool b0 = (c & 1u) != 0u;
  const bool b1 = (c & 2u) != 0u;
  const float q0 = b1 ? (b0 ? TQ_C3 : TQ_C2) : (b0 ? TQ_C1 : TQ_C0);
  const float q1 = b1 ? (b0 ? TQ_C7 : TQ_C6) : (b0 ? TQ_C5 : TQ_C4);
  const float q2 = b1 ? (b0 ? TQ_C11 : TQ_C10) : (b0 ? TQ_C9 : TQ_C8);
  const float q3 = b1 ? (b0 ? TQ_C15 : TQ_C14) : (b0 ? TQ_C13 : TQ_C12);
  const float h0 = (c & 4u) ? q1 : q0;
  const float h1 = (c & 4u) ? q3 : q2;
  return (c & 8u) ? h1 : h0;
#endif
}
#else
KV_FN float tq_value(uint32_t c) {
  return 0.0f;  // not a TurboQuant kernel: never called
}
#endif

// iq4_nl's codebook (ggml's kvalues_iq4nl: -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25,
// 38, 53, 69, 89, 113) as int8 bytes in four register words, code c in byte c & 3 of word
// c >> 2 (little-endian). Values, not a memory table: nothing to place in an address space.
#define IQ4_NL_WORD0 0xBFAD9881u
#define IQ4_NL_WORD1 0xF6EADDCFu
#define IQ4_NL_WORD2 0x26190D01u
#define IQ4_NL_WORD3 0x71594535u

// iq4_nl code c (0..15) to its codebook value (an integer in [-127, 113]).
KV_FN float iq4_nl_value(uint32_t c) {
  const uint32_t w = c < 8u ? (c < 4u ? IQ4_NL_WORD0 : IQ4_NL_WORD1)
                            : (c < 12u ? IQ4_NL_WORD2 : IQ4_NL_WORD3);
  const int b = int((w >> (8u * (c & 3u))) & 0xFFu);
  return float(b - ((b & 0x80) << 1));  // the byte as int8
}

// An FP8 byte c to its value (OCP FP8, exact in float32). E4M3 (kv_code 3): bias 7, 3
// mantissa bits, no infinity, 0x7F / 0xFF NaN. E5M2 (4): bias 15, 2 mantissa bits, exponent 31
// infinity (mantissa 0) or NaN. Built from bits, never from a denormal float: a subnormal is
// m * 2^(1 - bias - m_bits), an exact product of two normal floats.
KV_FN float fp8_value(uint32_t c, int kv_code) {
  const bool e4 = kv_code == KV_FP8_E4M3;
  const uint32_t m_bits = e4 ? 3u : 2u;
  const uint32_t bias = e4 ? 7u : 15u;
  const uint32_t e = (c >> m_bits) & (e4 ? 0xFu : 0x1Fu);
  const uint32_t m = c & ((1u << m_bits) - 1u);
  const float sub = float(m) * bits_to_float((128u - bias - m_bits) << 23);
  const float nrm = bits_to_float(((e + 127u - bias) << 23) | (m << (23u - m_bits)));
  const bool special = e4 ? (e == 15u && m == 7u) : (e == 31u);
  const float spec = bits_to_float(e4 || m != 0u ? 0x7FC00000u : 0x7F800000u);
  const float mag = special ? spec : (e == 0u ? sub : nrm);
  return (c & 0x80u) ? -mag : mag;
}

// Nibble j (bits 4j..4j+3) of a word to its value before scaling: fp4 gives 2*value (see
// above), int4 the two's-complement integer in [-8, 7], iq4_nl its codebook value.
KV_FN float nibble_value(uint32_t w, int j, int kv_code) {
  const uint32_t c = (w >> (4 * j)) & 0xFu;
  if (kv_code == KV_FP4) {
    const float mag2 = float((FP4_MAG2_TABLE >> (4u * (c & 7u))) & 0xFu);
    return (c & 8u) ? -mag2 : mag2;
  }
  if (kv_code == KV_IQ4_NL) {
    return iq4_nl_value(c);
  }
  return float(int(c ^ 8u) - 8);
}

// Element e of a 32-bit word of a quantized row to its value before scaling: byte e for FP8,
// bits 2e..2e+1 for tq2 (TurboQuant's bit stream, lowest bits first), nibble e for the 4-bit
// codes (tq4's stream puts code e in nibble e too).
KV_FN float code_value(uint32_t w, int e, int kv_code) {
  if (KV_IS_FP8(kv_code)) {
    return fp8_value((w >> (8 * e)) & 0xFFu, kv_code);
  }
  if (kv_code == KV_TQ2_MSE) {
    return tq_value((w >> (2 * e)) & 0x3u);
  }
  if (kv_code == KV_TQ4_MSE) {
    return tq_value((w >> (4 * e)) & 0xFu);
  }
  return nibble_value(w, e, kv_code);
}

// The row column of element x (0 .. epv-1, in storage order) of the row's vector vcol. Every
// format stores columns in order except iq4_nl: byte t of a 32-column block (ggml's
// block_iq4_nl, 16 bytes) holds column t in its low nibble and t + 16 in its high one, and a
// vector (16, 8 or 4 bytes) lies inside one block.
KV_FN int elem_col(int vcol, int x, int epv, int kv_code) {
  if (kv_code != KV_IQ4_NL) {
    return vcol * epv + x;
  }
  const int byte = vcol * (epv / 2) + x / 2;  // byte of the row
  return (byte / 16) * 32 + byte % 16 + 16 * (x % 2);
}

// The multiplier of a group's stored float16 scale: fp4 values come out of the table x2.
KV_FN float scale_factor(int kv_code) {
  return kv_code == KV_FP4 ? 0.5f : 1.0f;
}

// Online-softmax weight of a partial with running max m under the common max m_all; a partial
// that saw no row (m = -inf) weighs 0 (never exp(-inf - -inf) = NaN).
KV_FN float merge_weight(float m, float m_all) {
  return m == KV_NEG_INF ? 0.0f : KV_EXP(m - m_all);
}

// A zero vector (member assignment: no constructor syntax that differs between backends).
KV_FN uint4 zero_like(uint4 v) {
  v.x = 0u;
  v.y = 0u;
  v.z = 0u;
  v.w = 0u;
  return v;
}
KV_FN uint2 zero_like(uint2 v) {
  v.x = 0u;
  v.y = 0u;
  return v;
}
KV_FN uint32_t zero_like(uint32_t v) {
  return 0u;
}

// Butterfly reductions over the 32 lanes (fixed order: xor 16, 8, 4, 2, 1). Every lane ends
// with the same value: lane a computes x_a + x_b where its partner computes x_b + x_a.
KV_FN float lane_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    v += lane_xor(v, off);
  }
  return v;
}

KV_FN float lane_max(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    v = KV_FMAX(v, lane_xor(v, off));
  }
  return v;
}
