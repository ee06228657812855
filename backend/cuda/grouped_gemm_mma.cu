// The experts' GEMMs (grouped_gemm.cu's grouped_gemm and grouped_weight_grad) on tensor cores:
// bf16 and f16 on compute capability 8.0 and later, outside deterministic mode (a warp's product
// sums in its own order, not the reduced index ascending: deterministic targets keep
// grouped_gemm.cu's kernels). A block of four warps owns a 64 x 64 tile of the output, each warp
// 16 of its rows; the operands go through shared memory kMmaDepth reduced indices at a time as
// 16-bit tiles (rows 8 elements longer than the tile: a warp's fragment reads touch 32 banks),
// and warp_fragments.cu's products add them in f32.
//
// grouped_gemm_mma: x's rows of each group that overlaps the tile and the group's weights; each
// group's product is summed apart and added only into the group's own rows, so a weight's inf or
// NaN reaches no other group's rows (its zero rows would make 0 x inf = NaN there otherwise).
// grouped_weight_grad_mma: one group's [k, f] tile, x's columns (transposed into shared memory)
// times dy over the group's rows.
//
// Follows grouped_gemm.cu and warp_fragments.cu in one source (their Params, group bounds and
// fragments); test_cuda_grouped_gemm runs it through test/cuda_emulation.hpp as it does that
// file's kernels. backend/cuda/cuda_grouped_gemm.hpp says when a call takes it.

namespace tsr_grouped {

constexpr int kMmaThreads = 128;  // four warps
constexpr int kMmaDepth = 32;     // reduced indices a shared-memory step holds

// One shared-memory step of a warp's product: its 16 rows of A (row-major `a`, rows `ld_a` long,
// from row w0) times B (row-major [kMmaDepth][...] `b`, rows `ld_b` long), added into `acc`,
// 8 columns a fragment.
template <class T, int NC>
__device__ __forceinline__ void warp_product_step(float (&acc)[NC][4], const uint16_t* a, int ld_a, int w0, const uint16_t* b, int ld_b) {
  TSR_UNROLL for (int k = 0; k < kMmaDepth; k += 16) {
    uint32_t af[4];
    tsr_mma::a_fragment(af, a, ld_a, w0, k);
    TSR_UNROLL for (int j = 0; j < NC; ++j) {
      uint32_t bf[2];
      tsr_mma::b_fragment_of_columns(bf, b, ld_b, k, 8 * j);
      tsr_mma::mma(acc[j], af, bf, T());
    }
  }
}

// A warp's sums into the row-major [rows, cols] matrix at `to`: element i of fragment j is row
// row0 + g (+ 8 for i >= 2), column col0 + 8 j + 2 t (+ 1 for odd i); those inside the matrix.
template <class T, int NC>
__device__ __forceinline__ void store_fragments(T* to, long long rows, long long cols, long long row0, long long col0, const float (&acc)[NC][4]) {
  const int lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  TSR_UNROLL for (int i = 0; i < 4; ++i) {
    const long long row = row0 + g + 8 * (i / 2);
    if (row >= rows) continue;
    TSR_UNROLL for (int j = 0; j < NC; ++j) {
      const long long col = col0 + 8 * j + 2 * t + i % 2;
      if (col < cols) store(to + row * cols + col, acc[j][i]);
    }
  }
}

template <class T>
__device__ void grouped_gemm_mma(const Params& p) {
  constexpr int LX = kMmaDepth + 8, LW = kTile + 8, NC = kTile / 8;
  uint16_t* xs = reinterpret_cast<uint16_t*>(tsr_shared_memory());  // [kTile][LX]
  uint16_t* ws = xs + kTile * LX;                                     // [kMmaDepth][LW]
  const uint16_t* x = reinterpret_cast<const uint16_t*>(p.x);
  const uint16_t* w = reinterpret_cast<const uint16_t*>(p.other);
  T* out = static_cast<T*>(p.out);
  const int g = int(threadIdx.x) % 32 / 4, w0 = int(threadIdx.x) / 32 * 16;
  const long long column_tiles = (p.f + kTile - 1) / kTile;
  const long long r0 = (long long)blockIdx.x / column_tiles * kTile, c0 = (long long)blockIdx.x % column_tiles * kTile;
  float acc[NC][4];
  TSR_UNROLL for (int j = 0; j < NC; ++j) TSR_UNROLL for (int i = 0; i < 4; ++i) acc[j][i] = 0;
  for (long long e = 0; e < p.experts; ++e) {
    const Rows rows = group_rows(p, e);
    const long long lo = larger(rows.begin, r0), hi = smaller(rows.end, r0 + kTile);
    if (lo >= hi) continue;
    const uint16_t* we = w + e * p.k * p.f;
    float part[NC][4];
    TSR_UNROLL for (int j = 0; j < NC; ++j) TSR_UNROLL for (int i = 0; i < 4; ++i) part[j][i] = 0;
    for (long long k0 = 0; k0 < p.k; k0 += kMmaDepth) {
      __syncthreads();  // every warp is done with the last tiles
      for (int i = int(threadIdx.x); i < kTile * kMmaDepth; i += kMmaThreads) {
        const int r = i / kMmaDepth, kk = i % kMmaDepth;  // x: consecutive threads read along a row
        const long long row = r0 + r, col = k0 + kk;
        xs[r * LX + kk] = row >= lo && row < hi && col < p.k ? x[row * p.k + col] : uint16_t(0);
      }
      for (int i = int(threadIdx.x); i < kMmaDepth * kTile; i += kMmaThreads) {
        const int kk = i / kTile, c = i % kTile;  // w: along a row of the expert's weights
        const long long row = k0 + kk, col = c0 + c;
        ws[kk * LW + c] = row < p.k && col < p.f ? we[row * p.f + col] : uint16_t(0);
      }
      __syncthreads();
      warp_product_step<T>(part, xs, LX, w0, ws, LW);
    }
    // Element i of a fragment is row w0 + g (+ 8 for i >= 2): only the group's own rows take it.
    TSR_UNROLL for (int i = 0; i < 4; ++i) {
      const long long row = r0 + w0 + g + 8 * (i / 2);
      if (row < lo || row >= hi) continue;
      TSR_UNROLL for (int j = 0; j < NC; ++j) acc[j][i] += part[j][i];
    }
  }
  store_fragments(out, p.n, p.f, r0 + w0, c0, acc);
}

// out [experts, k, f]: out[g] = x_g^T dy_g over the rows of group g this block of x holds, zero
// for a group with none. Blocks as grouped_weight_grad's: one per (group, tile of k, tile of f).
template <class T>
__device__ void grouped_weight_grad_mma(const Params& p) {
  constexpr int LX = kMmaDepth + 8, LD = kTile + 8, NC = kTile / 8;
  uint16_t* xs = reinterpret_cast<uint16_t*>(tsr_shared_memory());  // [kTile][LX]: x's columns k0.. by row
  uint16_t* ds = xs + kTile * LX;                                     // [kMmaDepth][LD]: dy's rows
  const uint16_t* x = reinterpret_cast<const uint16_t*>(p.x);
  const uint16_t* dy = reinterpret_cast<const uint16_t*>(p.other);
  T* out = static_cast<T*>(p.out);
  const int w0 = int(threadIdx.x) / 32 * 16;
  const long long k_tiles = (p.k + kTile - 1) / kTile, f_tiles = (p.f + kTile - 1) / kTile;
  const long long e = (long long)blockIdx.x / (k_tiles * f_tiles), tile = (long long)blockIdx.x % (k_tiles * f_tiles);
  const long long k0 = tile / f_tiles * kTile, f0 = tile % f_tiles * kTile;
  const Rows rows = group_rows(p, e);
  float acc[NC][4];
  TSR_UNROLL for (int j = 0; j < NC; ++j) TSR_UNROLL for (int i = 0; i < 4; ++i) acc[j][i] = 0;
  for (long long r0 = rows.begin; r0 < rows.end; r0 += kMmaDepth) {
    __syncthreads();  // every warp is done with the last tiles
    // Consecutive threads read along a row of x (coalesced) and write down a column of xs: the
    // transpose puts x's columns in A's rows, which a_fragment reads.
    for (int i = int(threadIdx.x); i < kMmaDepth * kTile; i += kMmaThreads) {
      const int rr = i / kTile, c = i % kTile;
      const long long row = r0 + rr, col = k0 + c;
      xs[c * LX + rr] = row < rows.end && col < p.k ? x[row * p.k + col] : uint16_t(0);
    }
    for (int i = int(threadIdx.x); i < kMmaDepth * kTile; i += kMmaThreads) {
      const int rr = i / kTile, c = i % kTile;
      const long long row = r0 + rr, col = f0 + c;
      ds[rr * LD + c] = row < rows.end && col < p.f ? dy[row * p.f + col] : uint16_t(0);
    }
    __syncthreads();
    warp_product_step<T>(acc, xs, LX, w0, ds, LD);
  }
  store_fragments(out + e * p.k * p.f, p.k, p.f, k0 + w0, f0, acc);
}

}  // namespace tsr_grouped
