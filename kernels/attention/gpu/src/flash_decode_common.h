// kvbench flash-decode: helpers shared VERBATIM by the Metal and CUDA kernels (and the CPU sim).
// The backend prelude (kernels/metal/flash_decode.metal, kernels/cuda/flash_decode.cu) defines
// KV_FN, DEV_PTR, TG_MEM, BARRIER(), KV_EXP, KV_FMAX, KV_NEG_INF, KV_UNROLL, lane_xor (a
// butterfly shuffle), bits_to_float, elem_of (2-byte dtypes) and the vector types uint2 / uint4;
// the wrapper (kernels/gpu_kernels.py) defines KV_CODE (0 dense, 1 fp4, 2 int4).
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

// Nibble j (bits 4j..4j+3) of a word to its value before scaling: fp4 gives 2*value (see
// above), int4 the two's-complement integer in [-8, 7].
KV_FN float nibble_value(uint32_t w, int j, int kv_code) {
  const uint32_t c = (w >> (4 * j)) & 0xFu;
  if (kv_code == 1) {
    const float mag2 = float((FP4_MAG2_TABLE >> (4u * (c & 7u))) & 0xFu);
    return (c & 8u) ? -mag2 : mag2;
  }
  return float(int(c ^ 8u) - 8);
}

// The multiplier of a group's stored float16 scale: fp4 values come out of the table x2.
KV_FN float scale_factor(int kv_code) {
  return kv_code == 1 ? 0.5f : 1.0f;
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
