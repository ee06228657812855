#include "jit/library_call.hpp"

#include "dsl/dot_form.hpp"
#include "dsl/error.hpp"

namespace tessera {

GemmShape gemm_shape(const Array& a, bool trans_a, const Array& b, const Array& out) {
  const auto& sa = a.shape_ref();
  const auto& so = out.shape_ref();
  const size_t r = sa.size();
  switch (dot_form(int64_t(r), int64_t(b.shape_ref().size()), int64_t(so.size()))) {
    case DotForm::Batched: {
      GemmShape s{so[r - 2], so[r - 1], trans_a ? sa[r - 2] : sa[r - 1], 1};
      for (size_t i = 0; i + 2 < r; ++i) s.batch *= sa[i];
      return s;
    }
    case DotForm::Rows: return {so.back() ? out.numel() / so.back() : 0, so.back(), sa.back(), 1};  // a's rows: one block
    case DotForm::ContractRows: return {so[0], so[1], sa.back() ? a.numel() / sa.back() : 0, 1};  // a read transposed
  }
  throw InternalError("gemm_shape: unknown dot form");
}

LibraryOp library_op_of(AttentionPart part) {
  switch (part) {
    case AttentionPart::Forward: return LibraryOp::AttentionForward;
    case AttentionPart::GradQ: return LibraryOp::AttentionGradQ;
    case AttentionPart::GradKV: return LibraryOp::AttentionGradKV;
  }
  throw InternalError("library_op_of: unknown attention part");
}

void throw_wrong_device(const Device& device, const char* wanted) {
  throw InternalError("a library kernel for " + std::string(wanted) + " was handed device " + device.name());
}

}  // namespace tessera
