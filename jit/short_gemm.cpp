#include "jit/short_gemm.hpp"

#include "tessera_config.hpp"

#include "dsl/determinism.hpp"

#if TESSERA_HAVE_LIBXSMM
#include <libxsmm.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#endif

namespace tessera {

#if TESSERA_HAVE_LIBXSMM
namespace {

// Output columns per kernel call: 48 (three AVX-512 vectors) measured best for 64-128 rows.
constexpr int64_t kColumnTile = 48;

void init_once() {
  static std::once_flag flag;
  std::call_once(flag, [] { libxsmm_init(); });
}

bool disabled() {
  static const bool off = [] {
    const char* v = std::getenv("TESSERA_SHORT_GEMM");
    return v && std::string_view(v) == "0";
  }();
  return off;
}

}  // namespace

bool short_sgemm(int64_t m, int64_t n, int64_t k, const float* a, bool trans_a, const float* b, bool trans_b,
                 float* out) {
  // Deterministic runs use run_gemm's ordered_gemm: a device's row count must not pick the
  // summation order.
  if (trans_b || m > kShortGemmMaxRows || m == 0 || n == 0 || k == 0 || disabled() || deterministic_mode()) return false;
  init_once();
  // LIBXSMM is column-major: out^T[n, m] = b^T[n, k] x a^T[k, m], where the row-major b is the
  // column-major b^T as it lies, and a^T needs LIBXSMM's transpose flag exactly when a does not.
  const libxsmm_blasint lda = libxsmm_blasint(n), ldb = libxsmm_blasint(trans_a ? m : k), ldc = libxsmm_blasint(n);
  const float alpha = 1.0f, beta = 0.0f;
  const int flags = LIBXSMM_GEMM_FLAG_BETA_0 | (trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
  const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  auto kernel_for = [&](int64_t cols) {
    return libxsmm_smmdispatch(libxsmm_blasint(cols), libxsmm_blasint(m), libxsmm_blasint(k), &lda, &ldb, &ldc,
                               &alpha, &beta, &flags, &prefetch);
  };
  const int64_t tile = std::min(kColumnTile, n), rest = n % tile;
  const libxsmm_smmfunction full = kernel_for(tile), last = rest ? kernel_for(rest) : nullptr;
  if (!full || (rest && !last)) return false;
  for (int64_t col = 0; col < n; col += tile) (col + tile <= n ? full : last)(b + col, a, out + col);
  return true;
}

#else

bool short_sgemm(int64_t, int64_t, int64_t, const float*, bool, const float*, bool, float*) { return false; }

#endif

}  // namespace tessera
