// CPU simulation of the quantize-on-write kernel: the SHARED text
// (kernels/attention/gpu/src/kv_encode_common.h and kv_encode_body.inc, included verbatim)
// under the CPU prelude (sim_prelude.h), every GPU thread one call (the threads share nothing:
// each writes its own unit), over a grid rounded up to whole threadgroups of 64 as CUDA
// launches it (the body must guard the extra threads). One binary holds every format: the body
// is included once per ENC_CODE, templated on D and GS as the GPU template makes them. Built
// and run by tests/test_kv_encode.py, which holds the outputs against the MLX-ops encoders of
// kernels/formats/ bit for bit.
// usage: kv_encode_sim CODE D GS DIR ROWS HKV L   DIR/k.bin, DIR/v.bin (float16 [ROWS, D]),
//        DIR/hs.bin (float32 [2, HKV]) -> DIR/k_codes.bin, v_codes.bin (+ k_scales.bin,
//        v_scales.bin float16 [ROWS, D/GS] unless FP8)
#include <cstdio>
#include <string>

#include "sim_prelude.h"

#include "kv_encode_common.h"

using T = _Float16;

#define ENC_KERNEL(fn, code)                                                                   \
  template <int D, int GS, typename CT>                                                        \
  void fn(const T* k_new, const T* v_new, const float* head_scales, const int* params,         \
          CT* k_codes, CT* v_codes, _Float16* k_scales, _Float16* v_scales, int unit,          \
          int which)

#define ENC_CODE ENC_FP4
ENC_KERNEL(enc_fp4, 1) {
#include "kv_encode_body.inc"
}
#undef ENC_CODE
#define ENC_CODE ENC_INT4
ENC_KERNEL(enc_int4, 2) {
#include "kv_encode_body.inc"
}
#undef ENC_CODE
#define ENC_CODE ENC_Q4_0
ENC_KERNEL(enc_q4_0, 3) {
#include "kv_encode_body.inc"
}
#undef ENC_CODE
#define ENC_CODE ENC_Q8_0
ENC_KERNEL(enc_q8_0, 4) {
#include "kv_encode_body.inc"
}
#undef ENC_CODE
#define ENC_CODE ENC_FP8_E4M3
ENC_KERNEL(enc_fp8_e4m3, 5) {
#include "kv_encode_body.inc"
}
#undef ENC_CODE
#define ENC_CODE ENC_FP8_E5M2
ENC_KERNEL(enc_fp8_e5m2, 6) {
#include "kv_encode_body.inc"
}
#undef ENC_CODE

template <typename X>
static std::vector<X> read_all(const std::string& path, size_t n) {
  std::vector<X> out(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(out.data(), sizeof(X), n, f) != n) out.clear();
  if (f) std::fclose(f);
  return out;
}

template <typename X>
static bool write_all(const std::string& path, const std::vector<X>& x) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(x.data(), sizeof(X), x.size(), f) == x.size();
  return std::fclose(f) == 0 && ok;
}

// Runs kernel `fn` over the grid and writes its outputs; `width` codes per row.
template <int D, int GS, typename CT, typename F>
static int run(F fn, size_t width, bool scales, const std::string& dir, int rows, int hkv,
               int per_head) {
  const auto k = read_all<T>(dir + "/k.bin", size_t(rows) * D);
  const auto v = read_all<T>(dir + "/v.bin", size_t(rows) * D);
  const auto hs = read_all<float>(dir + "/hs.bin", size_t(2) * hkv);
  if (k.empty() || v.empty() || hs.empty()) return 3;
  std::vector<CT> kc(size_t(rows) * width), vc(size_t(rows) * width);
  std::vector<_Float16> ks(size_t(rows) * (D / GS)), vs(size_t(rows) * (D / GS));
  const int params[3] = {rows, hkv, per_head};
  const int grid = (rows * (D / GS) + 63) / 64 * 64;
  for (int which = 0; which < 2; ++which) {
    for (int unit = 0; unit < grid; ++unit) {
      fn(k.data(), v.data(), hs.data(), params, kc.data(), vc.data(), ks.data(), vs.data(), unit,
         which);
    }
  }
  bool ok = write_all(dir + "/k_codes.bin", kc) && write_all(dir + "/v_codes.bin", vc);
  if (scales) ok = ok && write_all(dir + "/k_scales.bin", ks) && write_all(dir + "/v_scales.bin", vs);
  return ok ? 0 : 1;
}

// The instantiations the tests use: D 128 and 64, fp4 / int4 per row and per group of 32.
template <int D, int GS>
static int dispatch(const std::string& code, const std::string& dir, int rows, int hkv, int l) {
  if (code == "fp4") return run<D, GS, uint32_t>(enc_fp4<D, GS, uint32_t>, D / 8, true, dir, rows, hkv, l);
  if (code == "int4") return run<D, GS, uint32_t>(enc_int4<D, GS, uint32_t>, D / 8, true, dir, rows, hkv, l);
  if (code == "q4_0") return run<D, GS, uint8_t>(enc_q4_0<D, GS, uint8_t>, D / 2, true, dir, rows, hkv, l);
  if (code == "q8_0") return run<D, GS, int8_t>(enc_q8_0<D, GS, int8_t>, D, true, dir, rows, hkv, l);
  if (code == "fp8_e4m3") return run<D, GS, uint8_t>(enc_fp8_e4m3<D, GS, uint8_t>, D, false, dir, rows, hkv, l);
  if (code == "fp8_e5m2") return run<D, GS, uint8_t>(enc_fp8_e5m2<D, GS, uint8_t>, D, false, dir, rows, hkv, l);
  return 2;
}

int main(int argc, char** argv) {
  if (argc != 8) return 2;
  const std::string code = argv[1], dir = argv[4];
  const int d = std::atoi(argv[2]), gs = std::atoi(argv[3]);
  const int rows = std::atoi(argv[5]), hkv = std::atoi(argv[6]), l = std::atoi(argv[7]);
  if (d == 128 && gs == 128) return dispatch<128, 128>(code, dir, rows, hkv, l);
  if (d == 128 && gs == 32) return dispatch<128, 32>(code, dir, rows, hkv, l);
  if (d == 64 && gs == 64) return dispatch<64, 64>(code, dir, rows, hkv, l);
  if (d == 64 && gs == 32) return dispatch<64, 32>(code, dir, rows, hkv, l);
  return 2;
}
