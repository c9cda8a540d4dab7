// The GPU kernels' row decoders alone, compiled on the host: the helpers of
// kernels/attention/gpu/src/flash_decode_common.h (included verbatim, after the CPU prelude
// tests/cpu_sim/sim_prelude.h) applied to stored rows exactly as flash_decode_body.inc applies
// them (a row as VPR vectors of VEC bytes, each 32-bit word's elements through code_value, each
// placed at elem_col, times its group's or head's scale), so tests/test_gpu_decode.py can hold
// every value against kvbench's own dequantization bit for bit.
// Compile-time configuration (-D): KV_CODE, VEC (bytes of one vector load), D (head_dim), GS
// (elements per scale); TurboQuant also TQ_CODEBOOK and TQ_C0.. (the wrapper's header lines).
// usage: decode_check table OUT      writes code_value of every code of KV_CODE (float32)
//        decode_check rows DIR N     DIR/data.bin (uint8 [N, row bytes]), DIR/scales.bin
//                                    (float32 [N, D/GS]) -> DIR/out.bin (float32 [N, D])
#include <cstdio>
#include <string>

#include "sim_prelude.h"

#include "flash_decode_common.h"

#if KV_IS_FP8(KV_CODE)
constexpr int EPW = 4;
#elif KV_CODE == KV_TQ2_MSE
constexpr int EPW = 16;
#else
constexpr int EPW = 8;
#endif
constexpr int WORDS = VEC / 4;
constexpr int EPV = WORDS * EPW;
constexpr int VPR = D / EPV;
typedef typename VecOf<VEC>::type VecT;

static bool write_floats(const std::string& path, const std::vector<float>& x) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(x.data(), sizeof(float), x.size(), f) == x.size();
  return std::fclose(f) == 0 && ok;
}

template <typename X>
static std::vector<X> read_all(const std::string& path, size_t n) {
  std::vector<X> out(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(out.data(), sizeof(X), n, f) != n) out.clear();
  if (f) std::fclose(f);
  return out;
}

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "table") {
    std::vector<float> vals;
    const uint32_t n_codes = KV_IS_FP8(KV_CODE) ? 256u : (KV_CODE == KV_TQ2_MSE ? 4u : 16u);
    for (uint32_t c = 0; c < n_codes; ++c) {
      vals.push_back(code_value(c, 0, KV_CODE));  // element 0 of a word holding code c
    }
    return write_floats(argv[2], vals) ? 0 : 1;
  }
  if (argc != 4 || std::string(argv[1]) != "rows") return 2;
  const std::string dir = argv[2];
  const size_t n = size_t(std::atol(argv[3]));
  const auto data = read_all<VecT>(dir + "/data.bin", n * VPR);
  const auto scales = read_all<float>(dir + "/scales.bin", n * (D / GS));
  if (data.empty() || scales.empty()) return 3;
  std::vector<float> out(n * D);
  for (size_t r = 0; r < n; ++r) {
    for (int vcol = 0; vcol < VPR; ++vcol) {
      const VecT vec = data[r * VPR + vcol];
      const float s = scales[r * (D / GS) + (vcol * EPV) / GS] * scale_factor(KV_CODE);
      for (int w = 0; w < WORDS; ++w) {
        const uint32_t word = word_of(vec, w);
        for (int e = 0; e < EPW; ++e) {
          out[r * D + elem_col(vcol, w * EPW + e, EPV, KV_CODE)] = code_value(word, e, KV_CODE) * s;
        }
      }
    }
  }
  return write_floats(dir + "/out.bin", out) ? 0 : 1;
}
