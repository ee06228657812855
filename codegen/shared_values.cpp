#include "codegen/shared_values.hpp"

#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "codegen/kernel_mutator.hpp"

namespace tessera::kir {
namespace {

bool is_leaf(const Expr& e) { return e->op == Op::IntConst || e->op == Op::FloatConst || e->op == Op::Var || e->op == Op::Param; }

void collect_assigned(const StmtPtr& s, std::unordered_set<int>& assigned) {
  if (s->kind == Stmt::Kind::Assign) assigned.insert(s->var);
  for (const StmtPtr& child : s->body) collect_assigned(child, assigned);
}

// Rewrites one loop body's statements: nodes in `declared` become their variables.
class ScopeRewriter : public Mutator {
 public:
  std::unordered_map<const ExprNode*, Expr> declared;  // node -> its variable
  Expr value_of(const Expr& e) { return mutate_operands(e); }

 protected:
  Expr visit(const Expr& e) override {
    if (auto it = declared.find(e.get()); it != declared.end()) return it->second;
    return mutate_operands(e);
  }
};

class Binder {
 public:
  explicit Binder(Kernel& kernel) : kernel_(kernel) { collect_assigned(kernel.body, assigned_); }

  StmtPtr scope(const StmtPtr& s) {
    if (s->kind != Stmt::Kind::Block && s->kind != Stmt::Kind::For) return s;
    auto copy = std::make_shared<Stmt>(*s);
    copy->body = statements(s->body);
    return copy;
  }

 private:
  // Whether `e` reads a variable the kernel reassigns (memoised: expressions are DAGs).
  bool reads_assigned(const Expr& e) {
    if (auto it = reads_assigned_.find(e.get()); it != reads_assigned_.end()) return it->second;
    bool reads = e->op == Op::Var && assigned_.count(e->id);
    for (const Expr& arg : e->args) reads = reads_assigned(arg) || reads;
    reads_assigned_.emplace(e.get(), reads);
    return reads;
  }

  // The non-leaf nodes a statement's own expressions reach (not its nested loops'), each once.
  static void reach(const Expr& e, std::unordered_set<const ExprNode*>& seen, std::vector<Expr>& post_order) {
    if (!e || is_leaf(e) || !seen.insert(e.get()).second) return;
    for (const Expr& arg : e->args) reach(arg, seen, post_order);
    post_order.push_back(e);
  }

  std::vector<StmtPtr> statements(const std::vector<StmtPtr>& body) {
    // Which direct statements use each node; loops are scopes of their own.
    std::vector<std::vector<Expr>> reached(body.size());
    std::unordered_map<const ExprNode*, int> uses;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i]->kind == Stmt::Kind::For || body[i]->kind == Stmt::Kind::Block) continue;
      std::unordered_set<const ExprNode*> seen;
      reach(body[i]->a, seen, reached[i]);
      reach(body[i]->b, seen, reached[i]);
      for (const Expr& e : reached[i]) ++uses[e.get()];
    }
    ScopeRewriter rewrite;
    std::vector<StmtPtr> out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i]->kind == Stmt::Kind::For || body[i]->kind == Stmt::Kind::Block) {
        out.push_back(scope(body[i]));
        continue;
      }
      // Children before parents: a declared value reads the variables of its shared operands.
      for (const Expr& e : reached[i]) {
        if (uses[e.get()] < 2 || rewrite.declared.count(e.get()) || e->type == Type::I1 || reads_assigned(e)) continue;
        const int v = kernel_.num_vars++;
        out.push_back(declare(v, e->type, rewrite.value_of(e)));
        rewrite.declared.emplace(e.get(), var(v, e->type));
      }
      out.push_back(rewrite.mutate(body[i]));
    }
    return out;
  }

  Kernel& kernel_;
  std::unordered_set<int> assigned_;
  std::unordered_map<const ExprNode*, bool> reads_assigned_;
};

}  // namespace

void bind_shared_values(Kernel& kernel) {
  if (kernel.body) kernel.body = Binder(kernel).scope(kernel.body);
}

}  // namespace tessera::kir
