#include "codegen/split_loops.hpp"

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "codegen/kernel_mutator.hpp"

namespace tessera::kir {
namespace {

bool is_var(const Expr& e, int v) { return e->op == Op::Var && e->id == v; }

// v / c or v % c with a constant c > 1: the divisor, else 0.
int64_t divisor_of(const Expr& e, int v) {
  if (e->op != Op::Div && e->op != Op::Rem) return 0;
  if (!is_var(e->args[0], v) || e->args[1]->op != Op::IntConst) return 0;
  return e->args[1]->iconst > 1 ? e->args[1]->iconst : 0;
}

// How often each divisor of loop variable `v` is used in a loop body (each shared
// subexpression counted once).
struct DivisorCounter {
  int v;
  std::unordered_set<const ExprNode*> seen;
  std::map<int64_t, int> uses;

  void visit(const Expr& e) {
    if (!seen.insert(e.get()).second) return;
    if (int64_t c = divisor_of(e, v)) ++uses[c];
    for (const Expr& a : e->args) visit(a);
  }
  void visit(const StmtPtr& s) {
    if (s->a) visit(s->a);
    if (s->b) visit(s->b);
    for (const StmtPtr& b : s->body) visit(b);
  }
};

// Rewrites a body for v = outer * c + inner (memoised: shared subexpressions stay shared).
class SplitRewriter final : public Mutator {
 public:
  SplitRewriter(int v, int64_t c, Expr outer, Expr inner, Expr whole)
      : v_(v), c_(c), outer_(std::move(outer)), inner_(std::move(inner)), whole_(std::move(whole)) {}

 private:
  using Mutator::visit;
  Expr visit(const Expr& e) override {
    if (divisor_of(e, v_) == c_) return e->op == Op::Div ? outer_ : inner_;
    if (is_var(e, v_)) return whole_;
    return mutate_operands(e);
  }

  int v_;
  int64_t c_;
  Expr outer_, inner_, whole_;
};

// The divisor to split a serial loop [0, trip) at: the most used one dividing the trip count
// (the larger on a tie: longer contiguous runs), or 0.
int64_t split_divisor(const Stmt& loop, int64_t trip) {
  DivisorCounter counter{loop.var, {}, {}};
  for (const StmtPtr& b : loop.body) counter.visit(b);
  int64_t best = 0;
  int best_uses = 0;
  for (const auto& [c, uses] : counter.uses)
    if (c < trip && trip % c == 0 && uses >= best_uses) best = c, best_uses = uses;
  return best;
}

StmtPtr split_at_divisors_in(const StmtPtr& s, Kernel& kernel) {
  StmtPtr out = s;
  if (s->kind == Stmt::Kind::For && s->loop == LoopKind::Serial && s->a->op == Op::IntConst && s->a->iconst == 0 && s->b->op == Op::IntConst) {
    const int64_t trip = s->b->iconst;
    if (const int64_t c = split_divisor(*s, trip)) {
      const int vo = kernel.num_vars++, vi = kernel.num_vars++;
      SplitRewriter rewriter(s->var, c, var(vo), var(vi), binary(Op::Add, binary(Op::Mul, var(vo), int_const(c)), var(vi)));
      std::vector<StmtPtr> body;
      for (const StmtPtr& b : s->body) body.push_back(rewriter.mutate(b));
      out = for_loop(vo, int_const(0), int_const(trip / c), {for_loop(vi, int_const(0), int_const(c), std::move(body))});
      out->independent = out->body.front()->independent = s->independent;  // the same iterations, renamed
    }
  }
  if (out->body.empty()) return out;
  // Loops nested inside (the new inner loop included) may split further.
  auto copy = out == s ? std::make_shared<Stmt>(*s) : out;
  for (StmtPtr& b : copy->body) b = split_at_divisors_in(b, kernel);
  return copy;
}

}  // namespace

void split_loops_at_divisors(Kernel& kernel) { kernel.body = split_at_divisors_in(kernel.body, kernel); }

}  // namespace tessera::kir
