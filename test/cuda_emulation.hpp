// CUDA C compiled as C++ and run on the CPU, for the tests: a kernel written for NVRTC (the
// library's hand-written ones, backend/cuda/flash_attention.cu) is included after this header,
// and emulated_launch() runs each block of a grid with one host thread per CUDA thread, so the
// same source's barriers (__syncthreads), warp shuffles (__shfl_xor_sync), tensor-core products
// (backend/cuda/warp_mma.cu's, from the same fragments) and dynamic shared memory behave as on a GPU. Blocks run one after another, each with fresh shared memory filled
// with NaN bytes, so a kernel that reads shared memory it never wrote shows it in its results.
// Supported: the subset those kernels use (1-D grids and blocks, the prelude's conversions).
#pragma once

#include <barrier>
#include <math.h>  // expf, logf, exp and log in the global namespace, as CUDA has them
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "dsl/dtype.hpp"

#define TESSERA_CUDA_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define TSR_UNROLL

namespace tessera::cuda_emulation {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

// One warp's lanes meet here to exchange values, and the fragments of a tensor-core product.
struct Warp {
  explicit Warp(int lanes) : meet(lanes), values(size_t(lanes)) {}
  std::barrier<> meet;
  std::vector<double> values;
  uint32_t a[32][4] = {}, b[32][2] = {};
};

struct ThreadState {
  std::barrier<>* block = nullptr;
  Warp* warp = nullptr;
  unsigned lane = 0;
  unsigned char* shared = nullptr;
};
inline thread_local ThreadState current;

// Runs `kernel` (a callable the emulated threads call, reading threadIdx and blockIdx) on a grid
// of `blocks` blocks of `threads` threads (a multiple of 32) with `shared_bytes` of dynamic
// shared memory.
void launch(int64_t blocks, int threads, int64_t shared_bytes, const std::function<void()>& kernel);

}  // namespace tessera::cuda_emulation

inline thread_local tessera::cuda_emulation::Index threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { tessera::cuda_emulation::current.block->arrive_and_wait(); }

template <class T>
T __shfl_xor_sync(unsigned /*mask: every lane*/, T value, int lane_mask) {
  auto& s = tessera::cuda_emulation::current;
  s.warp->values[s.lane] = double(value);  // exact for float and double
  s.warp->meet.arrive_and_wait();
  const T other = T(s.warp->values[s.lane ^ unsigned(lane_mask)]);
  s.warp->meet.arrive_and_wait();  // nobody writes the next value before all have read this one
  return other;
}

inline unsigned char* tsr_shared_memory() { return tessera::cuda_emulation::current.shared; }

inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline double __longlong_as_double(long long bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}
// The kernel prelude's conversions (codegen/cuda_prelude.cpp), which give dsl/dtype.hpp's bits.
inline float tsr_bf16_to_f32(uint16_t bits) { return tessera::bf16_to_float(bits); }
inline float tsr_f16_to_f32(uint16_t bits) { return tessera::f16_to_float(bits); }
inline uint16_t tsr_f32_to_bf16(float value) { return tessera::float_to_bf16(value); }
inline uint16_t tsr_f32_to_f16(float value) { return tessera::float_to_f16(value); }

namespace tessera::cuda_emulation {

// mma.sync.m16n8k16 with f32 sums (backend/cuda/warp_mma.cu): every lane gives its fragments of
// A and B, then each computes its own four elements of D from all of them. A[row][k] lies with
// lane 4 (row % 8) + (k % 8) / 2 in register (row >= 8) + 2 (k >= 8); B[k][n] with lane
// 4 n + (k % 8) / 2 in register (k >= 8); the element in the low half for even k.
template <float (*widen16)(uint16_t)>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  auto& s = current;
  for (int i = 0; i < 4; ++i) s.warp->a[s.lane][i] = a[i];
  for (int i = 0; i < 2; ++i) s.warp->b[s.lane][i] = b[i];
  s.warp->meet.arrive_and_wait();
  auto half = [](uint32_t word, unsigned k) { return widen16(uint16_t(k % 2 ? word >> 16 : word & 0xffffu)); };
  auto at_a = [&](unsigned row, unsigned k) { return half(s.warp->a[4 * (row % 8) + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k); };
  auto at_b = [&](unsigned k, unsigned n) { return half(s.warp->b[4 * n + (k % 8) / 2][k >= 8], k); };
  const unsigned g = s.lane / 4, t = s.lane % 4;
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned row = g + 8 * (i >= 2), column = 2 * t + i % 2;
    float sum = d[i];
    for (unsigned k = 0; k < 16; ++k) sum += at_a(row, k) * at_b(k, column);
    d[i] = sum;
  }
  s.warp->meet.arrive_and_wait();  // nobody writes the next fragments before all have read these
}

}  // namespace tessera::cuda_emulation

inline void tsr_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  tessera::cuda_emulation::mma_m16n8k16<tsr_bf16_to_f32>(d, a, b);
}
inline void tsr_mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  tessera::cuda_emulation::mma_m16n8k16<tsr_f16_to_f32>(d, a, b);
}

inline void tessera::cuda_emulation::launch(int64_t blocks, int threads, int64_t shared_bytes, const std::function<void()>& kernel) {
  std::vector<double> shared(size_t((shared_bytes + 7) / 8));
  for (int64_t b = 0; b < blocks; ++b) {
    std::memset(shared.data(), 0xff, shared.size() * sizeof(double));  // NaN in every float and double
    std::barrier<> block(threads);
    std::vector<std::unique_ptr<Warp>> warps;
    for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<Warp>(32));
    std::vector<std::thread> team;
    team.reserve(size_t(threads));
    for (int t = 0; t < threads; ++t)
      team.emplace_back([&, t] {
        threadIdx = {unsigned(t), 0, 0};
        blockIdx = {unsigned(b), 0, 0};
        blockDim = {unsigned(threads), 1, 1};
        gridDim = {unsigned(blocks), 1, 1};
        current = {&block, warps[size_t(t / 32)].get(), unsigned(t % 32), reinterpret_cast<unsigned char*>(shared.data())};
        kernel();
      });
    for (std::thread& t : team) t.join();
  }
}
