#include "codegen/kernel_mutator.hpp"

namespace tessera::kir {

Expr Mutator::mutate(const Expr& e) {
  if (!e) return e;
  if (auto it = memo_.find(e.get()); it != memo_.end()) return it->second.to;
  Expr out = visit(e);
  memo_.emplace(e.get(), Rewrite{e, out});
  return out;
}

StmtPtr Mutator::mutate(const StmtPtr& s) { return s ? visit(s) : s; }

Expr Mutator::mutate_operands(const Expr& e) {
  std::vector<Expr> args;
  bool changed = false;
  for (const Expr& a : e->args) {
    args.push_back(mutate(a));
    changed |= args.back() != a;
  }
  if (!changed) return e;
  auto copy = std::make_shared<ExprNode>(*e);
  copy->args = std::move(args);
  return copy;
}

StmtPtr Mutator::mutate_children(const StmtPtr& s) {
  auto copy = std::make_shared<Stmt>(*s);
  copy->a = mutate(s->a);
  copy->b = mutate(s->b);
  for (StmtPtr& b : copy->body) b = mutate(b);
  return copy;
}

}  // namespace tessera::kir
