#include "backend/cpu/cpu_gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "jit/library_call.hpp"
#include "backend/cpu/short_gemm.hpp"

namespace tessera {
namespace {

// TESSERA_DETERMINISTIC=1: out[i, j] = sum over p = 0..k-1, in that order, of a(i, p) * b(p, j),
// each a rounded multiply then a rounded add, so its bits depend neither on m or n (a device's
// share of rows or columns) nor on which lanes a vector loop gives it. OpenBLAS makes no such
// promise: its Haswell sgemm kernels (picked on AVX2 machines, or by OPENBLAS_CORETYPE=Haswell)
// sum a row differently depending on whether it falls in a 12-, 8-, 4-, 2- or 1-row block.
template <typename T>
void ordered_gemm(int64_t m, int64_t n, int64_t k, const T* a, bool trans_a, const T* b, bool trans_b, T* out) {
  std::vector<T> b_rows;  // b as [k, n] rows, so the inner loop runs over contiguous memory
  if (trans_b) {
    b_rows.resize(size_t(k * n));
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) b_rows[size_t(p * n + j)] = b[j * k + p];
    b = b_rows.data();
  }
  const int64_t a_row = trans_a ? 1 : k, a_col = trans_a ? m : 1;  // a(i, p) = a[i * a_row + p * a_col]
  for (int64_t i = 0; i < m; ++i) {
    T* o = out + i * n;
    std::fill(o, o + n, T(0));
    for (int64_t p = 0; p < k; ++p) {
      const T x = a[i * a_row + p * a_col];
      const T* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) {
        const T product = x * bp[j];  // kept apart from the add: no fused multiply-add
        o[j] += product;
      }
    }
  }
}

// op(x) widened to f32, in the layout x has.
Array widened(const Array& x) {
  Array wide = Array::uninitialized(x.shape(), DType::f32);
  const auto* from = x.data<bf16_t>();
  float* to = wide.mutable_data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) to[i] = bf16_to_float(from[i].bits);
  return wide;
}

// bf16 operands: sums in f32, each output rounded once. VDPBF16PS tiles where the CPU has them;
// elsewhere (and in the fixed order) the operands are widened to f32, which is exact, and the
// f32 GEMM runs: the ordered path then gives the bits the generated kernels give (a bf16
// product is exact in f32, so contraction cannot change them).
void bf16_gemm(const Array& a, bool trans_a, const Array& b, bool trans_b, Array& out, bool ordered, int parts,
               const PartRunner& run) {
  const auto [m, n, k, batch] = gemm_shape(a, trans_a, b, out);
  auto* to = reinterpret_cast<uint16_t*>(out.mutable_data<bf16_t>());
  if (!ordered && short_bf16_gemm(batch, m, n, k, reinterpret_cast<const uint16_t*>(a.data<bf16_t>()), trans_a,
                                  reinterpret_cast<const uint16_t*>(b.data<bf16_t>()), trans_b, to, parts, run))
    return;
  Array sums = Array::uninitialized(out.shape(), DType::f32);
  host_gemm(widened(a), trans_a, widened(b), trans_b, sums, ordered, parts, run);
  const float* from = sums.data<float>();
  for (int64_t i = 0, count = out.numel(); i < count; ++i) to[i] = float_to_bf16(from[i]);
}

// The BLAS library's products, shared among `parts` parts as units of (batch entry, rows of
// op(a)): each part calls a single-threaded BLAS on its rows. OpenBLAS's own threads, woken for
// each call, fought the device's helper threads for the same cores: on a 2-core Zen 3 a
// training step's [1024 x 64] x [64 x 64] products took 0.75 ms inside the step against 0.15 ms
// alone.
void blas_gemm(int64_t batch, int64_t m, int64_t n, int64_t k, const Array& a, bool trans_a, const Array& b, bool trans_b,
               Array& out, int parts, const PartRunner& run) {
  if (batch == 0) return;  // a device's empty shard of the batch
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);  // whoever set more since
  constexpr int64_t kMinRows = 16;  // fewer rows than this in a part: the call costs more than it shares
  const int64_t row_chunks = std::clamp<int64_t>((parts + batch - 1) / batch, 1, std::max<int64_t>(1, m / kMinRows));
  const int64_t units = batch * row_chunks;
  const int used = int(std::clamp<int64_t>(parts, 1, units));
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const blasint lda = blasint(trans_a ? m : k), ldb = blasint(trans_b ? k : n);
  auto part = [&](int p) {
    for (int64_t u = units * p / used; u < units * (p + 1) / used; ++u) {
      const int64_t i = u / row_chunks, chunk = u % row_chunks;
      const int64_t first = m * chunk / row_chunks, rows = m * (chunk + 1) / row_chunks - first;
      // op(a)'s rows [first, first + rows): columns of a stored transposed, rows otherwise.
      const int64_t a_offset = i * m * k + (trans_a ? first : first * k), b_offset = i * k * n, out_offset = i * m * n + first * n;
      if (a.dtype() == DType::f32)
        cblas_sgemm(CblasRowMajor, ta, tb, blasint(rows), blasint(n), blasint(k), 1.0f, a.data<float>() + a_offset, lda,
                    b.data<float>() + b_offset, ldb, 0.0f, out.mutable_data<float>() + out_offset, blasint(n));
      else
        cblas_dgemm(CblasRowMajor, ta, tb, blasint(rows), blasint(n), blasint(k), 1.0, a.data<double>() + a_offset, lda,
                    b.data<double>() + b_offset, ldb, 0.0, out.mutable_data<double>() + out_offset, blasint(n));
    }
  };
  if (used > 1 && run) run(used, part);
  else
    for (int p = 0; p < used; ++p) part(p);
}

}  // namespace

void host_gemm(const Array& a, bool trans_a, const Array& b, bool trans_b, Array& out, bool ordered, int parts,
               const PartRunner& run) {
  const auto [m, n, k, batch] = gemm_shape(a, trans_a, b, out);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::memset(out.mutable_bytes(), 0, size_t(out.nbytes()));
    return;
  }
  if (a.dtype() == DType::bf16) {
    bf16_gemm(a, trans_a, b, trans_b, out, ordered, parts, run);
    return;
  }
  if (ordered) {
    for (int64_t i = 0; i < batch; ++i) {
      if (a.dtype() == DType::f32)
        ordered_gemm(m, n, k, a.data<float>() + i * m * k, trans_a, b.data<float>() + i * k * n, trans_b,
                     out.mutable_data<float>() + i * m * n);
      else
        ordered_gemm(m, n, k, a.data<double>() + i * m * k, trans_a, b.data<double>() + i * k * n, trans_b,
                     out.mutable_data<double>() + i * m * n);
    }
    return;
  }
  if (a.dtype() == DType::f32 && short_gemm_preferred() && short_sgemm(batch, m, n, k, a.data<float>(), trans_a, b.data<float>(), trans_b,
                                             out.mutable_data<float>(), parts, run))
    return;
  blas_gemm(batch, m, n, k, a, trans_a, b, trans_b, out, parts, run);
}

}  // namespace tessera
