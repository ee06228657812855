// The primitives a backend may run as one library kernel (a vendor GEMM, a tiled attention
// kernel) instead of kernels generated from the kernel IR. Each backend fills its own table of
// them (jit/backend_registry.hpp); a program's Target (ir/target.hpp) says which its devices
// have, and an op whose primitive the target lacks is built from its parts before it is
// partitioned (jit/library_fallback.hpp), so every target runs the same user graph.
#pragma once

#include <cstdint>
#include <string_view>

#include "dsl/dtype.hpp"

namespace tessera {

// X(Enum, "name"), defined once: the enum and library_op_name come from this list.
#define TESSERA_LIBRARY_OPS(X)                                                                       \
  X(Gemm, "gemm")                      /* row-major batched out = op(a) x op(b) */                  \
  X(OrderedGemm, "ordered_gemm")       /* the same, each sum in source order (deterministic mode) */ \
  X(Bf16Gemm, "bf16_gemm")             /* gemm of bf16 operands: f32 sums, each output rounded once */ \
  X(OrderedBf16Gemm, "ordered_bf16_gemm") /* the same in source order: the generated kernel's bits */ \
  X(AttentionForward, "attention_forward") /* dsl/attention_parts.hpp's three parts */              \
  X(AttentionGradQ, "attention_grad_q")                                                             \
  X(AttentionGradKV, "attention_grad_kv")                                                           \
  X(GroupedGemm, "grouped_gemm")       /* dsl/grouped_matmul.hpp's two primitives: one GEMM per group, */ \
  X(GroupedWeightGradGemm, "grouped_weight_grad_gemm") /* its row range read from the ends buffer */

enum class LibraryOp {
#define TESSERA_LIBRARY_OP_ENUM(name, text) name,
  TESSERA_LIBRARY_OPS(TESSERA_LIBRARY_OP_ENUM)
#undef TESSERA_LIBRARY_OP_ENUM
};
#define TESSERA_LIBRARY_OP_COUNT(name, text) +1
constexpr int kLibraryOpCount = 0 TESSERA_LIBRARY_OPS(TESSERA_LIBRARY_OP_COUNT);
#undef TESSERA_LIBRARY_OP_COUNT

std::string_view library_op_name(LibraryOp op);

// The GEMM a Dot of `dtype` operands calls: bf16 ones their own, in source order when `ordered`
// (the deterministic mode).
LibraryOp gemm_library_op(DType dtype, bool ordered);

// A set of library ops, one bit each.
class LibraryOpSet {
 public:
  void insert(LibraryOp op) { bits_ |= bit(op); }
  bool contains(LibraryOp op) const { return (bits_ & bit(op)) != 0; }
  uint64_t bits() const { return bits_; }
  bool operator==(const LibraryOpSet&) const = default;

 private:
  static uint64_t bit(LibraryOp op) { return uint64_t(1) << int(op); }
  uint64_t bits_ = 0;
};

}  // namespace tessera
