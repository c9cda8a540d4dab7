// A stand-in for Metal's <metal_stdlib> and MLX's Metal prelude (mlx/backend/metal/kernels/
// utils.h, bf16.h: `typedef half float16_t`, `typedef bfloat bfloat16_t`, `using namespace
// metal`), so clang can syntax- and type-check the exact source MLX generates for a
// metal_kernel call. Written for kvbench's compile gate (tests/gates/metal_gate.py); it
// declares only what MSL kernels commonly use, with Metal's spelling. What it cannot catch is
// listed in docs/kernels.md.

typedef decltype(sizeof(0)) size_t;
typedef decltype((int*)0 - (int*)0) ptrdiff_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;  // the aarch64 target has _Float16 and (with +bf16) __bf16
typedef __bf16 bfloat;

// MSL address spaces are distinct: a `constant` pointer does not convert to a `device` one
// (clang's numbered address spaces behave the same); `thread` is the default (private) space.
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread

#define KV_VECTORS(T)                                 \
  typedef T T##2 __attribute__((ext_vector_type(2))); \
  typedef T T##3 __attribute__((ext_vector_type(3))); \
  typedef T T##4 __attribute__((ext_vector_type(4)));
KV_VECTORS(float)
KV_VECTORS(half)
KV_VECTORS(int)
KV_VECTORS(uint)
KV_VECTORS(short)
KV_VECTORS(ushort)
KV_VECTORS(char)
KV_VECTORS(uchar)
#undef KV_VECTORS

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_huge_valf()

namespace metal {
enum class mem_flags { mem_none, mem_device, mem_threadgroup, mem_texture };
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

template <class T> T simd_shuffle(T, ushort);
template <class T> T simd_shuffle_xor(T, ushort);
template <class T> T simd_shuffle_down(T, ushort);
template <class T> T simd_shuffle_up(T, ushort);
template <class T> T simd_broadcast(T, ushort);
template <class T> T simd_sum(T);
template <class T> T simd_max(T);
template <class T> T simd_min(T);
template <class T> T simd_prefix_exclusive_sum(T);
template <class T> T simd_prefix_inclusive_sum(T);

template <class T> T min(T, T);
template <class T> T max(T, T);
template <class T> T clamp(T, T, T);
template <class T> T abs(T);
template <class To, class From> To as_type(From);

#define KV_UNARY(name) float name(float); half name(half); float4 name(float4);
#define KV_BINARY(name) float name(float, float); half name(half, half);
KV_UNARY(exp) KV_UNARY(exp2) KV_UNARY(log) KV_UNARY(log2) KV_UNARY(sqrt) KV_UNARY(rsqrt)
KV_UNARY(fabs) KV_UNARY(floor) KV_UNARY(ceil) KV_UNARY(tanh) KV_UNARY(rint) KV_UNARY(round)
bool isinf(float);
bool isnan(float);
KV_BINARY(fmax) KV_BINARY(fmin) KV_BINARY(pow)
float fma(float, float, float);
namespace fast { KV_UNARY(exp) KV_UNARY(exp2) KV_UNARY(log) KV_BINARY(fmax) }
namespace precise { KV_UNARY(exp) KV_UNARY(exp2) KV_UNARY(log) KV_BINARY(fmax) }
#undef KV_UNARY
#undef KV_BINARY
}  // namespace metal
using namespace metal;

typedef half float16_t;  // MLX: mlx/backend/metal/kernels/utils.h
typedef bfloat bfloat16_t;  // MLX 0.32: mlx/backend/metal/kernels/bf16.h (native bfloat)
