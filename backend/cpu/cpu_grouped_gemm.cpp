#include "backend/cpu/cpu_grouped_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_gemm.hpp"

namespace tessera {
namespace {

// Each group's local rows [begin, end) in x's block. The bounds are made non-decreasing and
// clamped to the block, so sizes the run-time check refuses (dsl/index_check.hpp: the step's
// results are then dropped) still read and write only the buffers' own rows.
struct RowRange {
  int64_t begin = 0, end = 0;
};
std::vector<RowRange> groups_in_block(const Array& ends, int64_t row_offset, int64_t rows) {
  const int64_t* e = ends.data<int64_t>();
  std::vector<RowRange> out(size_t(ends.numel()));
  int64_t previous = 0;
  for (size_t g = 0; g < out.size(); ++g) {
    const int64_t end = std::max(previous, e[g]);
    auto local = [&](int64_t global) { return std::clamp<int64_t>(global - row_offset, 0, rows); };
    out[g] = {local(previous), local(end)};
    previous = end;
  }
  return out;
}

// Rows [first, first + count) of a row-major matrix, a view sharing its buffer.
Array rows_view(const Array& m, int64_t first, int64_t count) {
  const int64_t width = m.shape()[1];
  return m.subview(first * width * dtype_size(m.dtype()), {count, width});
}

// Entry e of a stacked [E, r, c] tensor as an [r, c] view.
Array expert_view(const Array& stacked, int64_t e) {
  const int64_t r = stacked.shape()[1], c = stacked.shape()[2];
  return stacked.subview(e * r * c * dtype_size(stacked.dtype()), {r, c});
}

void zero_row_range(Array& m, int64_t first, int64_t count) {
  if (count <= 0) return;
  const int64_t row_bytes = m.shape()[1] * dtype_size(m.dtype());
  std::memset(m.mutable_bytes() + first * row_bytes, 0, size_t(count * row_bytes));
}

}  // namespace

void grouped_gemm(const Array& x, const Array& w, const Array& ends, int64_t row_offset, Array& out, bool ordered, int parts,
                  const PartRunner& run) {
  const int64_t rows = x.shape()[0];
  int64_t written = 0;  // rows before this are computed: the groups are consecutive
  const std::vector<RowRange> groups = groups_in_block(ends, row_offset, rows);
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto [begin, end] = groups[g];
    if (end <= begin) continue;
    zero_row_range(out, written, begin - written);
    Array out_rows = rows_view(out, begin, end - begin);
    host_gemm(rows_view(x, begin, end - begin), false, expert_view(w, int64_t(g)), false, out_rows, ordered, parts, run);
    written = end;
  }
  zero_row_range(out, written, rows - written);  // padding rows past the last group, rows of no group
}

void grouped_weight_grad_gemm(const Array& x, const Array& dy, const Array& ends, int64_t row_offset, Array& out, bool ordered,
                              int parts, const PartRunner& run) {
  const std::vector<RowRange> groups = groups_in_block(ends, row_offset, x.shape()[0]);
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto [begin, end] = groups[g];
    Array grad = expert_view(out, int64_t(g));
    if (end <= begin) {  // an expert given no rows here: its gradient is zero
      std::memset(grad.mutable_bytes(), 0, size_t(grad.nbytes()));
      continue;
    }
    // x_e [rows, K] read transposed as it lies: [K, rows] x [rows, F].
    host_gemm(rows_view(x, begin, end - begin), true, rows_view(dy, begin, end - begin), false, grad, ordered, parts, run);
  }
}

}  // namespace tessera
