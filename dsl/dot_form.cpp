#include "dsl/dot_form.hpp"

#include <string>

#include "dsl/error.hpp"

namespace tessera {

DotForm dot_form(int64_t a_rank, int64_t b_rank, int64_t out_rank) {
  if (a_rank >= 2 && a_rank == b_rank && a_rank == out_rank) return DotForm::Batched;
  if (a_rank > 2 && b_rank == 2 && out_rank == a_rank) return DotForm::Rows;
  if (a_rank > 2 && a_rank == b_rank && out_rank == 2) return DotForm::ContractRows;
  throw InternalError("a dot of ranks " + std::to_string(a_rank) + " x " + std::to_string(b_rank) + " -> " +
                      std::to_string(out_rank) + " is none of its forms");
}

DotExtents dot_extents(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::vector<int64_t>& out,
                       bool a_transposed) {
  auto product = [](const std::vector<int64_t>& s, size_t from, size_t to) {
    int64_t p = 1;
    for (size_t i = from; i < to; ++i) p *= s[i];
    return p;
  };
  const size_t r = a.size(), ro = out.size();
  switch (dot_form(int64_t(r), int64_t(b.size()), int64_t(ro))) {
    case DotForm::Batched: return {out[ro - 2], out[ro - 1], a[a_transposed ? r - 2 : r - 1], product(a, 0, r - 2)};
    case DotForm::Rows: return {product(out, 0, ro - 1), out[ro - 1], a[r - 1], 1};  // a's rows: one block
    case DotForm::ContractRows: return {out[0], out[1], product(a, 0, r - 1), 1};    // a read transposed, as stored
  }
  return {};
}

}  // namespace tessera
