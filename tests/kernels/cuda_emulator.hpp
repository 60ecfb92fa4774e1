// SPDX-License-Identifier: Apache-2.0
// Just enough of CUDA's execution model, in C++20, to run the simple
// generated kernels on the CPU (tests/test_kernels_emulated.py): one OS
// thread per CUDA thread, the blocks of a grid one after another, shared
// memory as function statics (one block runs at a time), __syncthreads as a
// barrier of the block, warp shuffles through a per-warp barrier. Doubles
// are IEEE binary64 with every operation rounded once (build with
// -ffp-contract=off), as the __d*_rn intrinsics are on the GPU.
#pragma once
#include <barrier>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct tp_emu_dim3 { unsigned int x = 1, y = 1, z = 1; };
inline thread_local tp_emu_dim3 threadIdx, blockIdx;
inline tp_emu_dim3 blockDim, gridDim;

namespace tp_emu {
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline unsigned long long lanes[1024];

template <class F> void launch(unsigned int grid, unsigned int block, F&& body) {
  gridDim.x = grid;
  blockDim.x = block;
  for (unsigned int b = 0; b < grid; ++b) {
    std::barrier<> bar(block);
    block_barrier = &bar;
    warp_barriers.clear();
    for (unsigned int w = 0; w < (block + 31) / 32; ++w)
      warp_barriers.emplace_back(new std::barrier<>(block - 32 * w < 32 ? block - 32 * w : 32));
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned int t = 0; t < block; ++t)
      threads.emplace_back([&body, b, t] { blockIdx.x = b; threadIdx.x = t; body(); });
    for (auto& th : threads) th.join();
  }
}
}  // namespace tp_emu

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __restrict__ __restrict

inline void __syncthreads() { tp_emu::block_barrier->arrive_and_wait(); }

namespace tp_emu {
// A warp shuffle: every lane publishes v, then reads lane src's value where
// `valid` (else keeps its own), as __shfl_down_sync / __shfl_up_sync do.
template <class T> T shuffle(T v, unsigned int src, bool valid) {
  static_assert(sizeof(T) <= 8, "8-byte lanes");
  const unsigned int t = threadIdx.x;
  unsigned long long word = 0;
  std::memcpy(&word, &v, sizeof(T));
  lanes[t] = word;
  warp_barriers[t >> 5]->arrive_and_wait();
  T r = v;
  if (valid) std::memcpy(&r, &lanes[src], sizeof(T));
  warp_barriers[t >> 5]->arrive_and_wait();
  return r;
}
}  // namespace tp_emu

template <class T> T __shfl_down_sync(unsigned int, T v, int offset) {
  const unsigned int t = threadIdx.x;
  return tp_emu::shuffle(v, t + offset, (t & 31) + offset < 32);
}

template <class T> T __shfl_up_sync(unsigned int, T v, int offset) {
  const unsigned int t = threadIdx.x;
  return tp_emu::shuffle(v, t - offset, (t & 31) >= (unsigned int)offset);
}

inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }

inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline long long __double_as_longlong(double d) { long long r; std::memcpy(&r, &d, 8); return r; }
inline double __longlong_as_double(long long x) { double r; std::memcpy(&r, &x, 8); return r; }
inline int __double2hiint(double d) { return (int)(__double_as_longlong(d) >> 32); }
inline int __double2loint(double d) { return (int)(unsigned int)(__double_as_longlong(d) & 0xffffffffLL); }
inline double __hiloint2double(int hi, int lo) {
  return __longlong_as_double((long long)(((unsigned long long)(unsigned int)hi << 32) | (unsigned int)lo));
}
inline unsigned int __float_as_uint(float f) { unsigned int r; std::memcpy(&r, &f, 4); return r; }
inline float __uint_as_float(unsigned int x) { float r; std::memcpy(&r, &x, 4); return r; }
inline float __int_as_float(int x) { float r; std::memcpy(&r, &x, 4); return r; }

// The storage types and loads of codegen.PREAMBLE (which converts half types with PTX).
typedef unsigned short tp_half;
typedef unsigned short tp_bf16;
inline float tp_h2f(tp_half h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
inline float tp_b2f(tp_bf16 b) { return __uint_as_float(((unsigned int)b) << 16); }
template <class A, class B> struct tp_same { static constexpr bool value = false; };
template <class A> struct tp_same<A, A> { static constexpr bool value = true; };
// The store to an integer type, as codegen.PREAMBLE's (plain C++ there too).
template <class T, class V> T tp_to_int(V v) {
  if constexpr (tp_same<V, float>::value || tp_same<V, double>::value) {
    constexpr bool is_signed = (T)-1 < 0;
    constexpr int bits = 8 * sizeof(T);
    constexpr unsigned long long umax = is_signed ? (1ULL << (bits - 1)) - 1ULL
                                                  : (bits == 64 ? ~0ULL : (1ULL << bits) - 1ULL);
    const V top = (V)umax + (V)1;
    const V bottom = is_signed ? -top : (V)0;
    if (v != v) return (T)0;
    if (v >= top) return (T)umax;
    if (v <= bottom) return is_signed ? (T)(-(long long)umax - 1LL) : (T)0;
    return (T)v;
  } else {
    return (T)v;
  }
}
