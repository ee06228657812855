// Grouped GEMMs on CUDA devices: dsl/grouped_matmul.hpp's two primitives, a mixture of experts'
// GEMMs over rows sorted by expert. Each kernel reads the group bounds from the ends buffer on the
// device, so a call copies nothing to the host, waits for nothing and can be captured in a CUDA
// graph; the CPU's kernels (backend/cpu/cpu_grouped_gemm.cpp) read them the same way: group e
// is the global rows [max(ends[..e-1]), max(ends[..e])), clamped to the block, so bounds the
// run-time check refuses (dsl/index_check.hpp) still read and write only the buffers' own rows.
//
// One source, two compilers, as backend/cuda/flash_attention.cu: NVRTC compiles it for the GPU
// (backend/cuda/cuda_grouped_gemm.cpp puts the prelude and storage_types.cu before it and one
// `extern "C"` entry per kernel after it), and
// test_cuda_grouped_gemm compiles it as C++ after test/cuda_emulation.hpp and checks this very
// code against the CPU's kernels.
//
// Threads: 256 per block, a 16 x 16 grid (tx = threadIdx.x % 16, ty = threadIdx.x / 16); a block
// owns a 64 x 64 tile of its output and each thread the 4 x 4 elements at rows ty + 16 i and
// columns tx + 16 j. Operand tiles go through shared memory, rows padded by one element. Each
// output element is one thread's running sum in source order (the reduced index ascending), so
// the results do not depend on the launch: deterministic targets use the same kernels. Sums are
// f32 (f64 for f64); bf16 and f16 are storage formats.

namespace tsr_grouped {

constexpr int kThreads = 256;
constexpr int kSide = 16;
constexpr int kTile = 64;   // output rows and columns a block owns
constexpr int kDepth = 16;  // reduced indices a shared-memory step holds
constexpr int kPer = kTile / kSide;

// The kernels' one argument, by value; its layout is GroupedGemmParams's
// (backend/cuda/cuda_grouped_gemm.hpp), which test_cuda_grouped_gemm compares.
struct Params {
  const void* x;          // [n, k]
  const void* other;      // grouped_gemm: the weights [experts, k, f]; weight_grad: dy [n, f]
  const long long* ends;  // [experts], global running row totals
  void* out;              // grouped_gemm: [n, f]; weight_grad: [experts, k, f]
  long long n, k, f, experts;
  long long row_offset;   // the global position of x's first row
};

// Element types and their conversions: storage_types.cu, which comes before this file.
using tsr_storage::Bf16;
using tsr_storage::F16;
using tsr_storage::SumType;
using tsr_storage::widen;
using tsr_storage::store;

__device__ __forceinline__ long long clamp_rows(long long x, long long n) { return x < 0 ? 0 : x > n ? n : x; }
__device__ __forceinline__ long long larger(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long smaller(long long a, long long b) { return a < b ? a : b; }

// Group g's local rows [begin, end) of x's block: the running maximum of ends, so bounds never
// decrease, clamped to the block. Every thread computes the same (the loop is uniform).
struct Rows {
  long long begin, end;
};
__device__ __forceinline__ Rows group_rows(const Params& p, long long g) {
  long long before = 0;
  for (long long e = 0; e < g; ++e) before = larger(before, p.ends[e]);
  const long long through = larger(before, p.ends[g]);
  return {clamp_rows(before - p.row_offset, p.n), clamp_rows(through - p.row_offset, p.n)};
}

// A thread's sums into the row-major [rows, cols] matrix at `to`: its rows r0 + ty + 16 i and
// columns c0 + tx + 16 j of the block's tile, those inside the matrix.
template <class T, class S>
__device__ __forceinline__ void store_tile(T* to, long long rows, long long cols, long long r0, long long c0, S (&acc)[kPer][kPer]) {
  const int tx = int(threadIdx.x) % kSide, ty = int(threadIdx.x) / kSide;
  TSR_UNROLL for (int i = 0; i < kPer; ++i) {
    const long long row = r0 + ty + kSide * i;
    if (row >= rows) continue;
    TSR_UNROLL for (int j = 0; j < kPer; ++j) {
      const long long col = c0 + tx + kSide * j;
      if (col < cols) store(to + row * cols + col, acc[i][j]);
    }
  }
}

// out [n, f] = x [n, k] times other[g] [k, f] for the group g each row is in; zero for rows in
// none. Blocks: one per (row tile, column tile); a row tile meets the groups that overlap it, one
// pass each, and a thread adds only into rows of the pass's group (so a weight's inf or NaN
// reaches no other group's rows).
template <class T>
__device__ void grouped_gemm(const Params& p) {
  typedef typename SumType<T>::type S;
  S* xs = reinterpret_cast<S*>(tsr_shared_memory());  // [kTile][kDepth + 1]
  S* ws = xs + kTile * (kDepth + 1);                   // [kDepth][kTile + 1]
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.other);
  T* out = static_cast<T*>(p.out);
  const int tx = int(threadIdx.x) % kSide, ty = int(threadIdx.x) / kSide;
  const long long column_tiles = (p.f + kTile - 1) / kTile;
  const long long r0 = (long long)blockIdx.x / column_tiles * kTile, c0 = (long long)blockIdx.x % column_tiles * kTile;
  S acc[kPer][kPer];
  TSR_UNROLL for (int i = 0; i < kPer; ++i) TSR_UNROLL for (int j = 0; j < kPer; ++j) acc[i][j] = S(0);
  for (long long g = 0; g < p.experts; ++g) {
    const Rows rows = group_rows(p, g);
    const long long lo = larger(rows.begin, r0), hi = smaller(rows.end, r0 + kTile);
    if (lo >= hi) continue;
    const T* wg = w + g * p.k * p.f;
    bool mine[kPer];
    TSR_UNROLL for (int i = 0; i < kPer; ++i) mine[i] = r0 + ty + kSide * i >= lo && r0 + ty + kSide * i < hi;
    for (long long k0 = 0; k0 < p.k; k0 += kDepth) {
      for (int e = int(threadIdx.x); e < kTile * kDepth; e += kThreads) {
        const int r = e / kDepth, kk = e % kDepth;  // x: consecutive threads read along a row
        const long long row = r0 + r, col = k0 + kk;
        xs[r * (kDepth + 1) + kk] = row >= lo && row < hi && col < p.k ? S(widen(x[row * p.k + col])) : S(0);
      }
      for (int e = int(threadIdx.x); e < kTile * kDepth; e += kThreads) {
        const int kk = e / kTile, c = e % kTile;  // w: along a row of the expert's weights
        const long long row = k0 + kk, col = c0 + c;
        ws[kk * (kTile + 1) + c] = row < p.k && col < p.f ? S(widen(wg[row * p.f + col])) : S(0);
      }
      __syncthreads();
      const int depth = int(smaller(kDepth, p.k - k0));
      for (int kk = 0; kk < depth; ++kk)
        TSR_UNROLL for (int i = 0; i < kPer; ++i) {
          if (!mine[i]) continue;
          const S a = xs[(ty + kSide * i) * (kDepth + 1) + kk];
          TSR_UNROLL for (int j = 0; j < kPer; ++j) acc[i][j] += a * ws[kk * (kTile + 1) + tx + kSide * j];
        }
      __syncthreads();
    }
  }
  store_tile(out, p.n, p.f, r0, c0, acc);
}

// out [experts, k, f]: out[g] = x_g^T dy_g over the rows of group g this block of x holds, zero
// for a group with none. Blocks: one per (group, tile of k, tile of f), walking the group's rows
// kDepth at a time.
template <class T>
__device__ void grouped_weight_grad(const Params& p) {
  typedef typename SumType<T>::type S;
  S* xs = reinterpret_cast<S*>(tsr_shared_memory());  // [kTile][kDepth + 1]: x's columns by row
  S* ds = xs + kTile * (kDepth + 1);                   // [kDepth][kTile + 1]
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.other);
  T* out = static_cast<T*>(p.out);
  const int tx = int(threadIdx.x) % kSide, ty = int(threadIdx.x) / kSide;
  const long long k_tiles = (p.k + kTile - 1) / kTile, f_tiles = (p.f + kTile - 1) / kTile;
  const long long g = (long long)blockIdx.x / (k_tiles * f_tiles), tile = (long long)blockIdx.x % (k_tiles * f_tiles);
  const long long k0 = tile / f_tiles * kTile, f0 = tile % f_tiles * kTile;
  const Rows rows = group_rows(p, g);
  S acc[kPer][kPer];
  TSR_UNROLL for (int i = 0; i < kPer; ++i) TSR_UNROLL for (int j = 0; j < kPer; ++j) acc[i][j] = S(0);
  for (long long r0 = rows.begin; r0 < rows.end; r0 += kDepth) {
    for (int e = int(threadIdx.x); e < kTile * kDepth; e += kThreads) {
      const int rr = e / kTile, c = e % kTile;  // x's row r0 + rr, column k0 + c
      const long long row = r0 + rr, col = k0 + c;
      xs[c * (kDepth + 1) + rr] = row < rows.end && col < p.k ? S(widen(x[row * p.k + col])) : S(0);
    }
    for (int e = int(threadIdx.x); e < kTile * kDepth; e += kThreads) {
      const int rr = e / kTile, c = e % kTile;
      const long long row = r0 + rr, col = f0 + c;
      ds[rr * (kTile + 1) + c] = row < rows.end && col < p.f ? S(widen(dy[row * p.f + col])) : S(0);
    }
    __syncthreads();
    const int depth = int(smaller(kDepth, rows.end - r0));
    for (int rr = 0; rr < depth; ++rr)
      TSR_UNROLL for (int i = 0; i < kPer; ++i) {
        const S a = xs[(ty + kSide * i) * (kDepth + 1) + rr];
        TSR_UNROLL for (int j = 0; j < kPer; ++j) acc[i][j] += a * ds[rr * (kTile + 1) + tx + kSide * j];
      }
    __syncthreads();
  }
  store_tile(out + g * p.k * p.f, p.k, p.f, k0, f0, acc);
}

}  // namespace tsr_grouped
