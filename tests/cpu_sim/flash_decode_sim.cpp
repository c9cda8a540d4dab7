// CPU simulation of the flash-decode GPU kernels: compiles the SHARED source text
// (kernels/gpu/flash_decode_common.h and flash_decode_body.inc, included verbatim) with a third
// prelude in which every GPU thread is a std::thread, threadgroup memory is a static array
// (threadgroups run one after another), BARRIER() is a std::barrier over the threadgroup and
// the simdgroup shuffles go through an exchange buffer with a barrier per simdgroup.
// It checks that the shared text compiles and computes the right thing with real concurrent
// threads and barriers; the Metal / CUDA preludes and entries (address spaces, intrinsics,
// MLX's generated signature) are not exercised. Built and run by tests/test_cpu_sim.py.
// Compile-time configuration (-D): KV_CODE, SIM_T, SIM_G, SIM_D, SIM_TILE, SIM_THREADS, SIM_GS.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

using std::min;

#define KV_FN inline
#define DEV_PTR
#define TG_PTR
#define TG_MEM static
#define BARRIER() g_tg_barrier->arrive_and_wait()
#define KV_EXP std::exp
#define KV_FMAX std::fmax
#define KV_NEG_INF (-INFINITY)
#define SCALE_T _Float16

static const float FP4_MAGNITUDE[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static std::unique_ptr<std::barrier<>> g_tg_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_simd_barrier;
static float g_exchange[32][32];  // [simdgroup][lane]
thread_local int t_lane, t_sg;

inline float lane_exchange(float v, int off) {
  g_exchange[t_sg][t_lane] = v;
  g_simd_barrier[t_sg]->arrive_and_wait();
  const float other = g_exchange[t_sg][t_lane ^ off];
  g_simd_barrier[t_sg]->arrive_and_wait();
  return other;
}

// Butterfly reductions over the 32 lanes (fixed order: xor 16, 8, 4, 2, 1), as on the GPUs.
inline float lane_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    v += lane_exchange(v, off);
  }
  return v;
}

inline float lane_max(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    v = std::fmax(v, lane_exchange(v, off));
  }
  return v;
}

#include "flash_decode_common.h"

#if KV_CODE == 0
using KT = SIM_T;
#else
using KT = uint32_t;
#endif

template <typename T, int G, int D, int TILE_KV, int THREADS, int GS>
void run_thread(const T* q, const KT* k, const KT* v, const _Float16* k_scales,
                const _Float16* v_scales, const int* params, const float* scale, float* o_part,
                float* m_part, float* l_part, int tid, int split, int bh) {
  // entry: what the Metal / CUDA entry lines define
  const int lane = tid % 32;
  const int sg = tid / 32;
  t_lane = lane;
  t_sg = sg;
#include "flash_decode_body.inc"
}

template <typename X>
std::vector<X> read_file(const char* path) {
  std::vector<X> out;
  FILE* f = std::fopen(path, "rb");
  if (!f) return out;
  X x;
  while (std::fread(&x, sizeof(X), 1, f) == 1) out.push_back(x);
  std::fclose(f);
  return out;
}

// usage: sim DIR n_bh  (DIR holds q k v k_scales v_scales params scale .bin; writes o m l .bin)
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string dir = argv[1];
  const int n_bh = std::atoi(argv[2]);
  auto path = [&](const char* n) { return dir + "/" + n + ".bin"; };
  auto q = read_file<SIM_T>(path("q").c_str());
  auto k = read_file<KT>(path("k").c_str());
  auto v = read_file<KT>(path("v").c_str());
  auto ks = read_file<_Float16>(path("k_scales").c_str());
  auto vs = read_file<_Float16>(path("v_scales").c_str());
  auto params = read_file<int32_t>(path("params").c_str());
  auto scale = read_file<float>(path("scale").c_str());
  const int n_splits = params[2];
  const size_t rows = size_t(n_bh) * SIM_G * n_splits;
  std::vector<float> o(rows * SIM_D), m(rows), l(rows);
  for (int bh = 0; bh < n_bh; ++bh) {
    for (int split = 0; split < n_splits; ++split) {  // one threadgroup at a time
      g_tg_barrier = std::make_unique<std::barrier<>>(SIM_THREADS);
      g_simd_barrier.clear();
      for (int s = 0; s < SIM_THREADS / 32; ++s) {
        g_simd_barrier.push_back(std::make_unique<std::barrier<>>(32));
      }
      std::vector<std::thread> threads;
      for (int tid = 0; tid < SIM_THREADS; ++tid) {
        threads.emplace_back([&, tid] {
          run_thread<SIM_T, SIM_G, SIM_D, SIM_TILE, SIM_THREADS, SIM_GS>(
              q.data(), k.data(), v.data(), ks.data(), vs.data(), params.data(), scale.data(),
              o.data(), m.data(), l.data(), tid, split, bh);
        });
      }
      for (auto& t : threads) t.join();
    }
  }
  auto write = [&](const char* n, const std::vector<float>& x) {
    FILE* f = std::fopen(path(n).c_str(), "wb");
    std::fwrite(x.data(), sizeof(float), x.size(), f);
    std::fclose(f);
  };
  write("o_part", o);
  write("m_part", m);
  write("l_part", l);
  return 0;
}
