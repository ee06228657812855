#include "backend/cpu/short_gemm.hpp"

#include "tessera_config.hpp"


#if TESSERA_HAVE_LIBXSMM
#include <libxsmm.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>
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
// fast on every shape measured (this project's 2-core EPYC, docs/PERFORMANCE.md: 0.94-1.07x
// OpenBLAS called directly, against 0.32-0.94x through the tiles), so it takes them all.
bool tiles_beat_blas() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512;
#else
  return false;
#endif
}

// Each b^T [n, k] of a batch as [k, n] rows, in 32x32 tiles so both sides stay in cache lines.
const float* packed_rows(const float* b_transposed, int64_t batch, int64_t k, int64_t n) {
  thread_local std::vector<float> rows;
  rows.resize(size_t(batch * k * n));
  constexpr int64_t tile = 32;
  for (int64_t i = 0; i < batch; ++i) {
    const float* from = b_transposed + i * k * n;
    float* to = rows.data() + i * k * n;
    for (int64_t j0 = 0; j0 < n; j0 += tile)
      for (int64_t p0 = 0; p0 < k; p0 += tile)
        for (int64_t j = j0; j < std::min(n, j0 + tile); ++j)
          for (int64_t p = p0; p < std::min(k, p0 + tile); ++p) to[p * n + j] = from[j * k + p];
  }
  return rows.data();
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
  const libxsmm_blasint lda = libxsmm_blasint(n), ldb = libxsmm_blasint(trans_a ? m : k), ldc = libxsmm_blasint(n);
  const float alpha = 1.0f;
  const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  const int64_t tile = std::min(kColumnTile, n), block = std::min(kShortGemmRowBlock, m), depth = std::min(kDepthChunk, k);
  // Kernels for [full, ragged] column tiles x [full, ragged] row blocks x [full, ragged] depth
  // chunks x [first chunk (overwrite), later chunks (accumulate)].
  libxsmm_smmfunction kernels[2][2][2][2] = {};
  for (int c = 0; c < 2; ++c)
    for (int r = 0; r < 2; ++r)
      for (int d = 0; d < 2; ++d)
        for (int later = 0; later < 2; ++later) {
          const int64_t cols = c ? n % tile : tile, rows = r ? m % block : block, ks = d ? k % depth : depth;
          if (cols == 0 || rows == 0 || ks == 0 || (later && k <= depth)) continue;
          const float beta = later ? 1.0f : 0.0f;
          const int flags = (later ? 0 : LIBXSMM_GEMM_FLAG_BETA_0) | (trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
          kernels[c][r][d][later] = libxsmm_smmdispatch(libxsmm_blasint(cols), libxsmm_blasint(rows), libxsmm_blasint(ks), &lda,
                                                        &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
          if (!kernels[c][r][d][later]) return false;
        }
  const float* b_rows = trans_b ? packed_rows(b, batch, k, n) : b;
  // Units of work: (batch entry, row block, column chunk); columns are chunked only when there
  // are fewer row blocks than parts.
  const int64_t row_blocks = (m + block - 1) / block, tiles = (n + tile - 1) / tile;
  const int64_t chunks = std::clamp<int64_t>((parts + batch * row_blocks - 1) / (batch * row_blocks), 1, tiles);
  const int64_t units = batch * row_blocks * chunks;
  const int used = int(std::clamp<int64_t>(parts, 1, units));
  auto part = [&](int p) {
    for (int64_t u = units * p / used; u < units * (p + 1) / used; ++u) {
      const int64_t chunk = u % chunks, row_block = u / chunks % row_blocks, i = u / (chunks * row_blocks);
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
        for (int64_t t = tiles * chunk / chunks; t < tiles * (chunk + 1) / chunks; ++t) {
          const int64_t col = t * tile;
          kernels[col + tile <= n ? 0 : 1][r][d][later](b_chunk + col, a_chunk, out_block + col);
        }
      }
    }
  };
  if (used > 1 && run) run(used, part);
  else
    for (int p = 0; p < used; ++p) part(p);
  return true;
}

#else

bool short_gemm_preferred() { return false; }

bool short_sgemm(int64_t, int64_t, int64_t, int64_t, const float*, bool, const float*, bool, float*, int, const PartRunner&) {
  return false;
}

#endif

}  // namespace tessera
