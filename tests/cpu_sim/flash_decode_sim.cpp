// CPU simulation of the flash-decode GPU kernels: compiles the SHARED source text
// (kernels/gpu/flash_decode_common.h, flash_decode_body.inc and flash_decode_combine.inc,
// included verbatim) with a third prelude in which every GPU thread is a std::thread,
// threadgroup memory is a static array (threadgroups run one after another), BARRIER() is a
// std::barrier over the threadgroup and each simdgroup shuffle goes through an exchange buffer
// between two barriers of the simdgroup (so every lane must reach it, as on a GPU).
// It checks that the shared text compiles and computes the right thing with real concurrent
// threads and barriers, reading K/V through strides as the kernel does; the Metal / CUDA
// preludes and entries (address spaces, intrinsics, MLX's generated signature) are not
// exercised. Built and run by tests/test_cpu_sim.py.
// Compile-time configuration (-D): KV_CODE, SIM_T, SIM_KT (K/V storage type), SIM_ST (the
// scales' type: _Float16 group scales, float FP8 head scales), SIM_G, SIM_D, SIM_TILE,
// SIM_THREADS, SIM_GS, SIM_VEC.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using std::min;

#include "sim_prelude.h"

#include "flash_decode_common.h"

using KT = SIM_KT;
using ST = SIM_ST;

template <typename T, int G, int D, int TILE_KV, int THREADS, int GS, int VEC>
void run_thread(const T* q, const int64_t* q_strides, const KT* k, const int64_t* k_strides,
                const KT* v, const int64_t* v_strides, const ST* k_scales,
                const int64_t* k_scales_strides, const ST* v_scales,
                const int64_t* v_scales_strides, const int* params, const float* scale,
                float* o_part, float* m_part, float* l_part, int tid, int split, int bh) {
  // entry: what the Metal / CUDA entry lines define
  const int lane = tid % 32;
  const int sg = tid / 32;
  t_lane = lane;
  t_sg = sg;
#include "flash_decode_body.inc"
}

template <typename T, int D>
void run_combine(const float* o_part, const float* m_part, const float* l_part, const int* params,
                 T* out, int lane, int row) {
  t_lane = lane;
  t_sg = 0;
#include "flash_decode_combine.inc"
}

template <typename X>
std::vector<X> read_file(const std::string& path) {
  std::vector<X> out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  X x;
  while (std::fread(&x, sizeof(X), 1, f) == 1) out.push_back(x);
  std::fclose(f);
  return out;
}

template <typename X>
void write_file(const std::string& path, const std::vector<X>& x) {
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(x.data(), sizeof(X), x.size(), f);
  std::fclose(f);
}

// Runs n_threads std::threads as one threadgroup of n_simd simdgroups.
template <typename F>
void run_group(int n_threads, F body) {
  g_tg_barrier = std::make_unique<std::barrier<>>(n_threads);
  g_simd_barrier.clear();
  for (int s = 0; s < n_threads / 32; ++s) {
    g_simd_barrier.push_back(std::make_unique<std::barrier<>>(32));
  }
  std::vector<std::thread> threads;
  for (int tid = 0; tid < n_threads; ++tid) {
    threads.emplace_back([&, tid] { body(tid); });
  }
  for (auto& t : threads) t.join();
}

// usage: sim DIR n_bh (DIR holds q k v k_scales v_scales (+ _strides, int64) params scale .bin;
// writes o_part m_part l_part (float32) and out (SIM_T) .bin)
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string dir = argv[1];
  const int n_bh = std::atoi(argv[2]);
  auto path = [&](const std::string& n) { return dir + "/" + n + ".bin"; };
  auto q = read_file<SIM_T>(path("q"));
  auto k = read_file<KT>(path("k"));
  auto v = read_file<KT>(path("v"));
  auto ks = read_file<ST>(path("k_scales"));
  auto vs = read_file<ST>(path("v_scales"));
  auto st = [&](const char* n) { return read_file<int64_t>(path(std::string(n) + "_strides")); };
  auto qst = st("q"), kst = st("k"), vst = st("v"), kss = st("k_scales"), vss = st("v_scales");
  auto params = read_file<int32_t>(path("params"));
  auto scale = read_file<float>(path("scale"));
  const int n_splits = params[2];
  const int rows = n_bh * SIM_G;
  std::vector<float> o(size_t(rows) * n_splits * SIM_D), m(size_t(rows) * n_splits),
      l(size_t(rows) * n_splits);
  for (int bh = 0; bh < n_bh; ++bh) {
    for (int split = 0; split < n_splits; ++split) {  // one threadgroup at a time
      run_group(SIM_THREADS, [&](int tid) {
        run_thread<SIM_T, SIM_G, SIM_D, SIM_TILE, SIM_THREADS, SIM_GS, SIM_VEC>(
            q.data(), qst.data(), k.data(), kst.data(), v.data(), vst.data(), ks.data(),
            kss.data(), vs.data(), vss.data(), params.data(), scale.data(), o.data(), m.data(),
            l.data(), tid, split, bh);
      });
    }
  }
  std::vector<SIM_T> out(size_t(rows) * SIM_D);
  const int combine_params[1] = {n_splits};
  for (int row = 0; row < rows; ++row) {
    run_group(32, [&](int lane) {
      run_combine<SIM_T, SIM_D>(o.data(), m.data(), l.data(), combine_params, out.data(), lane,
                                row);
    });
  }
  write_file(path("o_part"), o);
  write_file(path("m_part"), m);
  write_file(path("l_part"), l);
  write_file(path("out"), out);
  return 0;
}
