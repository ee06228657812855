#include "jit/library_call.hpp"

#include <string>

#include "dsl/dot_form.hpp"
#include "dsl/error.hpp"

namespace tessera {

GemmShape gemm_shape(const Array& a, bool trans_a, const Array& b, const Array& out) {
  const DotExtents e = dot_extents(a.shape_ref(), b.shape_ref(), out.shape_ref(), trans_a);
  return {e.m, e.n, e.k, e.batch};
}

LibraryOp library_op_of(AttentionPart part) {
  switch (part) {
    case AttentionPart::Forward: return LibraryOp::AttentionForward;
    case AttentionPart::GradQ: return LibraryOp::AttentionGradQ;
    case AttentionPart::GradKV: return LibraryOp::AttentionGradKV;
  }
  throw InternalError("library_op_of: unknown attention part");
}

LibraryOp grouped_library_op(OpKind op) {
  if (op == OpKind::GroupedDot) return LibraryOp::GroupedGemm;
  if (op == OpKind::GroupedWeightGrad) return LibraryOp::GroupedWeightGradGemm;
  throw InternalError("grouped_library_op: " + std::string(op_name(op)) + " is no grouped primitive");
}

void throw_wrong_device(const Device& device, const char* wanted) {
  throw InternalError("a library kernel for " + std::string(wanted) + " was handed device " + device.name());
}

}  // namespace tessera
