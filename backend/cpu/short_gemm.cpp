#include "backend/cpu/short_gemm.hpp"

#include "tessera_config.hpp"


#if TESSERA_HAVE_LIBXSMM
#include <libxsmm.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/transpose_16bit.hpp"
#include "dsl/dtype.hpp"
#endif

namespace tessera {

#if TESSERA_HAVE_LIBXSMM
namespace {

// Output columns per kernel call: 48 (three AVX-512 vectors) measured best for 64-128 rows.
constexpr int64_t kColumnTile = 48;
// Depth per kernel call: a 128-row block of a long contraction (a weight gradient over every
// token, k = 2048) is cut into chunks that stay in L2 while the column tiles reuse them.
constexpr int64_t kDepthChunk = 512;

void init_once() {
  static std::once_flag flag;
  std::call_once(flag, [] { libxsmm_init(); });
}

// Where LIBXSMM's tiles beat OpenBLAS: on AVX-512 machines, whose Debian OpenBLAS may run AVX2
// kernels (AMD Zen 4: half the speed, short_gemm.hpp). On AVX2 machines OpenBLAS is at least as
// fast on every shape measured (this project's 2-core EPYC, docs/PERFORMANCE_HISTORY.md: 0.94-1.07x
// OpenBLAS called directly, against 0.32-0.94x through the tiles), so it takes them all. Where
// OpenBLAS does run AVX-512 kernels (its Cooperlake ones, on a Zen 4 with AVX512-BF16), the
// tiles still measured 0.97-1.20x OpenBLAS on the GPT's shapes and 1.02x at 1024^3.
bool tiles_beat_blas() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512;
#else
  return false;
#endif
}

// Each b^T [n, k] of a batch as [k, n] rows, in tiles of 32 of its rows.
// The tiles are shared among `parts` as the product is: packed on one core, a batched q k^T of
// attention's shape (64 x [128 x 32] x [32 x 128]) took as long on two cores as on one.
const float* packed_rows(const float* b_transposed, int64_t batch, int64_t k, int64_t n, int parts, const PartRunner& run) {
  thread_local std::vector<float> rows;  // the caller's: the parts write into it, and it outlives them
  rows.resize(size_t(batch * k * n));
  constexpr int64_t tile = 32;
  const int64_t column_tiles = (n + tile - 1) / tile, units = batch * column_tiles;  // (batch entry, tile of op(b)'s columns)
  const int used = int(std::clamp<int64_t>(parts, 1, units));
  auto pack = [&, to_all = rows.data()](int q) {
    for (int64_t u = units * q / used; u < units * (q + 1) / used; ++u) {
      const int64_t i = u / column_tiles, j0 = (u % column_tiles) * tile;
      // Rows [j0, j0 + columns) of the row-major [n, k] entry are a column-major [k, columns]
      // block; LIBXSMM's JIT-ed transpose writes it as columns [j0, ...) of the [k, n] rows.
      const libxsmm_blasint columns = libxsmm_blasint(std::min(tile, n - j0));
      libxsmm_otrans(to_all + i * k * n + j0, b_transposed + i * k * n + j0 * k, sizeof(float), libxsmm_blasint(k), columns,
                     libxsmm_blasint(k), libxsmm_blasint(n));
    }
  };
  if (used > 1 && run) run(used, pack);
  else
    for (int q = 0; q < used; ++q) pack(q);
  return rows.data();
}

// The tiles of a [batch, m, n] product shared among `parts`: units of (batch entry, row block,
// column chunk), columns chunked only when there are fewer row blocks than parts.
struct TileSplit {
  int64_t row_blocks, tiles, chunks, units;
  int used;  // parts that get work
  TileSplit(int64_t batch, int64_t m, int64_t n, int64_t block, int64_t tile, int parts)
      : row_blocks((m + block - 1) / block), tiles((n + tile - 1) / tile) {
    chunks = std::clamp<int64_t>((parts + batch * row_blocks - 1) / (batch * row_blocks), 1, tiles);
    units = batch * row_blocks * chunks;
    used = int(std::clamp<int64_t>(parts, 1, units));
  }
  // Runs unit(i, row_block, first_tile, end_tile) for every unit of part p.
  template <class F>
  void for_units_of(int p, F&& unit) const {
    for (int64_t u = units * p / used; u < units * (p + 1) / used; ++u) {
      const int64_t chunk = u % chunks, row_block = u / chunks % row_blocks, i = u / (chunks * row_blocks);
      unit(i, row_block, tiles * chunk / chunks, tiles * (chunk + 1) / chunks);
    }
  }
  void run(const PartRunner& runner, const std::function<void(int)>& part) const {
    if (used > 1 && runner) runner(used, part);
    else
      for (int p = 0; p < used; ++p) part(p);
  }
};

// The LIBXSMM kernels of a tiled product, [full, ragged] column tiles x [full, ragged] row blocks
// x [full, ragged] depth chunks x [first chunk (overwrite), later chunks (accumulate)], from
// `dispatch` (libxsmm_smmdispatch, libxsmm_bsmmdispatch) with `flags` besides beta's. False when
// LIBXSMM has one of them not.
template <class Kernel, class Dispatch>
bool tile_kernels(Kernel (&kernels)[2][2][2][2], Dispatch dispatch, int64_t n, int64_t m, int64_t k, int64_t tile, int64_t block,
                  int64_t depth, libxsmm_blasint lda, libxsmm_blasint ldb, int flags) {
  const float alpha = 1.0f;
  const libxsmm_blasint ldc = libxsmm_blasint(n);
  const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  for (int c = 0; c < 2; ++c)
    for (int r = 0; r < 2; ++r)
      for (int d = 0; d < 2; ++d)
        for (int later = 0; later < 2; ++later) {
          const int64_t cols = c ? n % tile : tile, rows = r ? m % block : block, ks = d ? k % depth : depth;
          if (cols == 0 || rows == 0 || ks == 0 || (later && k <= depth)) continue;
          const float beta = later ? 1.0f : 0.0f;
          const int all_flags = flags | (later ? 0 : LIBXSMM_GEMM_FLAG_BETA_0);
          kernels[c][r][d][later] = dispatch(libxsmm_blasint(cols), libxsmm_blasint(rows), libxsmm_blasint(ks), &lda, &ldb, &ldc,
                                             &alpha, &beta, &all_flags, &prefetch);
          if (!kernels[c][r][d][later]) return false;
        }
  return true;
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

// Rows [first, end) of op(b) [k, n] (b stored as [n, k] when transposed) in LIBXSMM's VNNI A
// layout, [k_even / 2][n][2]: rows p and p + 1 interleaved, a zero row after an odd k.
void pack_vnni(const uint16_t* b, bool trans_b, int64_t k, int64_t n, int64_t first, int64_t end, uint16_t* to) {
  for (int64_t p = first; p < end; ++p) {
    uint16_t* row = to + (p / 2) * n * 2 + (p & 1);
    if (p == k) {
      for (int64_t j = 0; j < n; ++j) row[j * 2] = 0;
    } else if (trans_b) {
      for (int64_t j = 0; j < n; ++j) row[j * 2] = b[j * k + p];
    } else {
      const uint16_t* from = b + p * n;
      for (int64_t j = 0; j < n; ++j) row[j * 2] = from[j];
    }
  }
}

// Rows [row0, row0 + rows) of op(a) [m, k] as rows of k_even elements (zero after an odd k). A
// stored transpose is transposed in tiles (backend/cpu/transpose_16bit.hpp).
void pack_rows(const uint16_t* a, bool trans_a, int64_t rows, int64_t m, int64_t k, int64_t row0, uint16_t* to) {
  const int64_t k_even = k + (k & 1);
  if (trans_a) transpose_16bit(a + row0, k, rows, m, to + row0 * k_even, k_even);
  else
    for (int64_t i = row0; i < row0 + rows; ++i) std::copy(a + i * k, a + (i + 1) * k, to + i * k_even);
  if (k_even != k)
    for (int64_t i = row0; i < row0 + rows; ++i) to[i * k_even + k] = 0;
}

// f32 sums rounded to bf16, 16 at a time by VCVTNEPS2BF16 (round to nearest even, as
// float_to_bf16; denormals flush to zero, as LIBXSMM's own bf16 outputs do). Only called where
// the CPU has AVX512-BF16 (short_bf16_gemm checks).
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16,avx512vl")))
#endif
void round_to_bf16(const float* from, uint16_t* to, int64_t count) {
  int64_t i = 0;
#if defined(__x86_64__)
  for (; i + 16 <= count; i += 16) {
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(from + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + i), reinterpret_cast<const __m256i&>(rounded));
  }
#endif
  for (; i < count; ++i) to[i] = float_to_bf16(from[i]);
}

}  // namespace

bool short_gemm_preferred() {
  static const bool preferred = [] {
    const char* v = std::getenv("TESSERA_SHORT_GEMM");
    if (v && std::string_view(v) == "0") return false;
    if (v && std::string_view(v) == "1") return true;  // on any machine (comparisons)
    return tiles_beat_blas();
  }();
  return preferred;
}

bool short_sgemm(int64_t batch, int64_t m, int64_t n, int64_t k, const float* a, bool trans_a, const float* b,
                 bool trans_b, float* out, int parts, const PartRunner& run) {
  if (batch == 0 || m == 0 || n == 0 || k == 0) return false;
  if (trans_b && m < kPackedWeightMinRows) return false;
  init_once();
  // LIBXSMM is column-major: out^T[n, m] = b^T[n, k] x a^T[k, m], where the row-major b is the
  // column-major b^T as it lies, and a^T needs LIBXSMM's transpose flag exactly when a does not.
  const int64_t tile = std::min(kColumnTile, n), block = std::min(kShortGemmRowBlock, m), depth = std::min(kDepthChunk, k);
  libxsmm_smmfunction kernels[2][2][2][2] = {};
  if (!tile_kernels(kernels, libxsmm_smmdispatch, n, m, k, tile, block, depth, libxsmm_blasint(n), libxsmm_blasint(trans_a ? m : k),
                    trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : 0))
    return false;
  const float* b_rows = trans_b ? packed_rows(b, batch, k, n, parts, run) : b;
  const TileSplit split(batch, m, n, block, tile, parts);
  auto part = [&](int p) {
    split.for_units_of(p, [&](int64_t i, int64_t row_block, int64_t first_tile, int64_t end_tile) {
      const int64_t row = row_block * block;
      const int r = row + block <= m ? 0 : 1;
      // op(a)'s rows [row, row + block): columns of a stored transposed, rows otherwise.
      const float* a_block = a + i * m * k + (trans_a ? row : row * k);
      const float* b_i = b_rows + i * k * n;
      float* out_block = out + i * m * n + row * n;
      // Depth chunks outermost: a chunk of the row block stays in cache across the column tiles.
      for (int64_t p = 0; p < k; p += depth) {
        const int d = p + depth <= k ? 0 : 1, later = p > 0;
        const float* a_chunk = a_block + (trans_a ? p * m : p);
        const float* b_chunk = b_i + p * n;
        for (int64_t t = first_tile; t < end_tile; ++t) {
          const int64_t col = t * tile;
          kernels[col + tile <= n ? 0 : 1][r][d][later](b_chunk + col, a_chunk, out_block + col);
        }
      }
    });
  };
  split.run(run, part);
  return true;
}

bool short_bf16_gemm(int64_t batch, int64_t m, int64_t n, int64_t k, const uint16_t* a, bool trans_a, const uint16_t* b,
                     bool trans_b, uint16_t* out, int parts, const PartRunner& run) {
  if (batch == 0 || m == 0 || n == 0 || k == 0 || !cpu_has_avx512_bf16()) return false;
  init_once();
  const int64_t k_even = k + (k & 1);
  // Column-major as in short_sgemm: out^T[n, m] = b^T[n, k] x a^T[k, m]; LIBXSMM's A (op(b))
  // must be VNNI-packed, its B (op(a)) is read as rows of k_even elements. Sums go to an f32
  // tile and are rounded once, after the last depth chunk.
  const libxsmm_blasint lda = libxsmm_blasint(n), ldb = libxsmm_blasint(k_even);
  // Depth chunks of twice short_sgemm's: the same bytes of cache (1.55x -> 1.62-1.80x f32's rate at 1024^3).
  const int64_t tile = std::min(kColumnTile, n), block = std::min(kShortGemmRowBlock, m), depth = std::min(2 * kDepthChunk, k_even);
  // One depth chunk (the GPT's k = 128 products): LIBXSMM rounds to bf16 in registers, writing
  // the output directly (through the f32 tile, 2M outputs cost 8 MB written and read again).
  // Longer depths sum chunk by chunk into the f32 tile.
  const bool one_chunk = k_even <= depth;
  libxsmm_bmmfunction direct[2][2][2][2] = {};
  libxsmm_bsmmfunction kernels[2][2][2][2] = {};
  if (one_chunk ? !tile_kernels(direct, libxsmm_bmmdispatch, n, m, k_even, tile, block, depth, lda, ldb, LIBXSMM_GEMM_FLAG_VNNI_A)
                : !tile_kernels(kernels, libxsmm_bsmmdispatch, n, m, k_even, tile, block, depth, lda, ldb, LIBXSMM_GEMM_FLAG_VNNI_A))
    return false;
  // Packed operands: every weight of the batch (k_even * n each), and op(a) when it is not rows
  // of k_even elements already.
  // The packing is shared among the parts too (at 1024^3 it is a tenth of the product's time).
  thread_local std::vector<uint16_t> packed_b, packed_a;
  packed_b.resize(size_t(batch * k_even * n));
  const bool a_as_rows = !trans_a && k_even == k;
  if (!a_as_rows) packed_a.resize(size_t(batch * m * k_even));
  const int packers = int(std::clamp<int64_t>(parts, 1, batch * k_even / 2));
  auto pack = [&, b_out = packed_b.data(), a_out = packed_a.data()](int q) {
    for (int64_t i = 0; i < batch; ++i) {
      // Each packer takes whole pairs of rows, so no two write the same interleaved pair.
      const int64_t pairs = k_even / 2, first = 2 * (pairs * q / packers), end = 2 * (pairs * (q + 1) / packers);
      pack_vnni(b + i * k * n, trans_b, k, n, first, end, b_out + i * k_even * n);
      if (!a_as_rows) {
        const int64_t row0 = m * q / packers, row1 = m * (q + 1) / packers;
        pack_rows(a + i * m * k, trans_a, row1 - row0, m, k, row0, a_out + i * m * k_even);
      }
    }
  };
  if (packers > 1 && run) run(packers, pack);
  else
    for (int q = 0; q < packers; ++q) pack(q);
  const uint16_t* a_rows = a_as_rows ? a : packed_a.data();
  const uint16_t* b_vnni = packed_b.data();
  const TileSplit split(batch, m, n, block, tile, parts);
  auto part = [&](int p) {
    thread_local std::vector<float> sums;  // this part's [block, n] f32 tile (its columns only)
    if (!one_chunk) sums.resize(size_t(block * n));
    split.for_units_of(p, [&](int64_t i, int64_t row_block, int64_t first_tile, int64_t end_tile) {
      const int64_t row = row_block * block, rows = std::min(block, m - row);
      const int r = row + block <= m ? 0 : 1;
      const auto* a_block = reinterpret_cast<const libxsmm_bfloat16*>(a_rows + (i * m + row) * k_even);
      const auto* b_i = reinterpret_cast<const libxsmm_bfloat16*>(b_vnni + i * k_even * n);
      if (one_chunk) {
        auto* out_block = reinterpret_cast<libxsmm_bfloat16*>(out + (i * m + row) * n);
        for (int64_t t = first_tile; t < end_tile; ++t) {
          const int64_t col = t * tile;
          direct[col + tile <= n ? 0 : 1][r][0][0](b_i + col * 2, a_block, out_block + col);
        }
        return;
      }
      for (int64_t p = 0; p < k_even; p += depth) {
        const int d = p + depth <= k_even ? 0 : 1, later = p > 0;
        for (int64_t t = first_tile; t < end_tile; ++t) {
          const int64_t col = t * tile;
          kernels[col + tile <= n ? 0 : 1][r][d][later](b_i + p * n + col * 2, a_block + p, sums.data() + col);
        }
      }
      const int64_t col_begin = first_tile * tile, col_end = std::min(n, end_tile * tile);
      for (int64_t y = 0; y < rows; ++y)
        round_to_bf16(sums.data() + y * n + col_begin, out + (i * m + row + y) * n + col_begin, col_end - col_begin);
    });
  };
  split.run(run, part);
  return true;
}

#else

bool short_gemm_preferred() { return false; }

bool short_sgemm(int64_t, int64_t, int64_t, int64_t, const float*, bool, const float*, bool, float*, int, const PartRunner&) {
  return false;
}

bool short_bf16_gemm(int64_t, int64_t, int64_t, int64_t, const uint16_t*, bool, const uint16_t*, bool, uint16_t*, int,
                     const PartRunner&) {
  return false;
}

#endif

}  // namespace tessera
