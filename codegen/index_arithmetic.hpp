// The index arithmetic of kernel lowering (codegen/lower_kernel.cpp): a value's extents, offsets
// and linear positions in its local block, as kernel IR over the program's symbolic parameters,
// and, for each op that only moves data (permute, broadcast, reshape, slice, pad, concat) and a
// local chunk read in place, which element of an input an element of the result reads. Nothing
// here depends on the target: loops, reductions and threads are the lowering's.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "codegen/kernel_ir.hpp"
#include "ir/local_program.hpp"

namespace tessera {

// An element of a value: one index per axis, or (flat kernels, pure elementwise) one linear index.
struct ElementIndex {
  std::vector<kir::Expr> axes;
  kir::Expr flat;
};

class IndexArithmetic {
 public:
  explicit IndexArithmetic(const LocalProgram& program) : p_(program) {}

  kir::Expr dim(const SymbolicDim& d) const;
  kir::Expr extent(int value, int64_t axis) const;  // of the local block
  kir::Expr offset(int value, int64_t axis) const;  // of the local block in the global value
  bool extent_is_one(int value, int64_t axis) const;
  kir::Expr numel(int value) const;
  // Row-major position in the local block.
  kir::Expr linearize(int value, const std::vector<kir::Expr>& axes) const;
  kir::Expr linear(int value, const ElementIndex& idx) const;

  // The element of movement op `value`'s input (inputs[0]) that element `idx` of it reads.
  ElementIndex permuted_source(int value, const ElementIndex& idx) const;
  ElementIndex broadcast_source(int value, const ElementIndex& idx) const;
  ElementIndex reshaped_source(int value, const ElementIndex& idx) const;
  ElementIndex sliced_source(int value, const ElementIndex& idx) const;
  // Pad: the input's element, clamped into its block so the load is safe whatever is selected,
  // and whether `idx` is inside the input (else it reads the fill).
  struct Padded {
    ElementIndex source;
    kir::Expr inside;
  };
  Padded padded_source(int value, const ElementIndex& idx) const;
  // Concat: per input in order, whether `idx` falls before that input's end, and its element
  // (clamped into its block).
  std::vector<std::pair<kir::Expr, ElementIndex>> concatenated_sources(int value, const ElementIndex& idx) const;
  // A local chunk (Replicate -> Shard, no communication): the block sits inside its input's,
  // shifted by the difference of their global offsets.
  ElementIndex chunk_source(int value, const ElementIndex& idx) const;

 private:
  const LocalNode& node(int id) const { return p_.nodes[size_t(id)]; }
  const LocalProgram& p_;
};

}  // namespace tessera
