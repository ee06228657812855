// A rewrite of kernel IR that keeps it a DAG (Halide's IRMutator, memoised). Each expression node
// is visited once, on identity, so a subexpression several consumers share stays one node after
// the rewrite (the renderers compute a shared node once); a node none of whose operands changed
// is returned as it is. Statements are copied with their expressions and bodies mutated. A pass
// overrides visit() for the nodes it changes and calls mutate_operands / mutate_children for the
// rest; kir::verify (codegen/kernel_verify.hpp) checks its output in the tests.
#pragma once

#include <unordered_map>

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

class Mutator {
 public:
  virtual ~Mutator() = default;

  Expr mutate(const Expr& e);
  StmtPtr mutate(const StmtPtr& s);

 protected:
  // One node's rewrite; by default the node rebuilt from its mutated operands.
  virtual Expr visit(const Expr& e) { return mutate_operands(e); }
  // One statement's rewrite; by default a copy with its expressions and body mutated.
  virtual StmtPtr visit(const StmtPtr& s) { return mutate_children(s); }

  Expr mutate_operands(const Expr& e);
  StmtPtr mutate_children(const StmtPtr& s);

 private:
  // Keyed on identity, and each entry holds its key: were a pass to mutate an expression it built
  // on the way and dropped, a new node at the freed address would find the dead one's rewrite
  // (codegen/lower_kernel.cpp's value memo had that bug).
  struct Rewrite {
    Expr from, to;
  };
  std::unordered_map<const ExprNode*, Rewrite> memo_;
};

}  // namespace tessera::kir
