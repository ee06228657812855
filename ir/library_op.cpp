#include "ir/library_op.hpp"

namespace tessera {

std::string_view library_op_name(LibraryOp op) {
  switch (op) {
#define TESSERA_LIBRARY_OP_NAME(name, text) \
  case LibraryOp::name: return text;
    TESSERA_LIBRARY_OPS(TESSERA_LIBRARY_OP_NAME)
#undef TESSERA_LIBRARY_OP_NAME
  }
  return "?";
}

LibraryOp gemm_library_op(DType dtype, bool ordered) {
  if (dtype == DType::bf16) return ordered ? LibraryOp::OrderedBf16Gemm : LibraryOp::Bf16Gemm;
  return ordered ? LibraryOp::OrderedGemm : LibraryOp::Gemm;
}

}  // namespace tessera
