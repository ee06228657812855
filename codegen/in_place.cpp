#include "codegen/in_place.hpp"

#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace tessera::kir {
namespace {

class InPlaceCheck {
 public:
  InPlaceCheck(int out, int in) : out_(out), in_(in) {}

  void walk(const StmtPtr& s) {
    if (!s || !ok_) return;
    switch (s->kind) {
      case Stmt::Kind::Block:
        for (const StmtPtr& child : s->body) walk(child);
        break;
      case Stmt::Kind::For:
        loads(s->a), loads(s->b);
        for (const StmtPtr& child : s->body) walk(child);
        break;
      case Stmt::Kind::Store:
        loads(s->a), loads(s->b);  // a store's index and value are read before it writes
        if (s->buffer == out_) {
          if (store_index_ && !equal(store_index_, s->a)) ok_ = false;
          store_index_ = s->a;
        }
        break;
      case Stmt::Kind::Declare:
      case Stmt::Kind::Assign:
        if (s->kind == Stmt::Kind::Assign) reassigned_.insert(s->var);
        loads(s->a);
        break;
    }
  }

  bool in_place() const {
    if (!ok_ || !store_index_ || load_indices_.empty() || uses_reassigned(store_index_)) return false;
    for (const Expr& index : load_indices_)
      if (!equal(index, store_index_)) return false;
    return true;
  }

 private:
  // The loads of `in` in a statement's expression; after the first store to `out` any is a
  // fault (a renderer may evaluate a shared subexpression again where it is used).
  void loads(const Expr& e) {
    if (e && ok_ && reads_in(e) && store_index_) ok_ = false;  // may read an element already written
  }

  // Whether `e` loads `in`, each load's index kept once: expressions are DAGs that share
  // subexpressions, so every node is visited once.
  bool reads_in(const Expr& e) {
    if (auto it = reads_in_.find(e.get()); it != reads_in_.end()) return it->second;
    bool reads = e->op == Op::Load && e->id == in_;
    if (reads) load_indices_.push_back(e->args[0]);
    for (const Expr& arg : e->args) reads |= reads_in(arg);
    reads_in_.emplace(e.get(), reads);
    return reads;
  }

  bool uses_reassigned(const Expr& e) const {
    if (e->op == Op::Var && reassigned_.count(e->id)) return true;
    for (const Expr& arg : e->args)  // an index is a small tree of loop variables and parameters
      if (uses_reassigned(arg)) return true;
    return false;
  }

  int out_, in_;
  bool ok_ = true;
  Expr store_index_;
  std::vector<Expr> load_indices_;
  std::set<int> reassigned_;
  std::unordered_map<const ExprNode*, bool> reads_in_;
};


// Answers by kernel body: a program's kernels come from the lowering memo
// (codegen/lowering_memo.hpp), so every program of a plan search asks of the same few thousand
// bodies, and a memory plan asks of each of a kernel's (output, input) pairs. Each answer holds
// its body, so no other body takes its address while it is kept.
class InPlaceAnswers {
 public:
  static constexpr size_t kMostAnswers = 100'000;
  std::optional<bool> find(const StmtPtr& body, int out, int in) {
    std::lock_guard lock(mutex_);
    auto it = answers_.find({body.get(), out, in});
    if (it == answers_.end()) return std::nullopt;
    return it->second.in_place;
  }
  void store(const StmtPtr& body, int out, int in, bool in_place) {
    std::lock_guard lock(mutex_);
    if (answers_.size() >= kMostAnswers) answers_.clear();
    answers_.insert({{body.get(), out, in}, Answer{body, in_place}});
  }

 private:
  struct Answer {
    StmtPtr body;
    bool in_place;
  };
  std::mutex mutex_;
  std::map<std::tuple<const Stmt*, int, int>, Answer> answers_;
};

InPlaceAnswers& in_place_answers() {
  static InPlaceAnswers* answers = new InPlaceAnswers;  // never destroyed: threads may plan while the process exits
  return *answers;
}

}  // namespace

bool writes_in_place(const Kernel& kernel, int out, int in) {
  if (out == in || out < 0 || in < 0 || size_t(out) >= kernel.buffers.size() || size_t(in) >= kernel.buffers.size()) return false;
  if (kernel.buffers[size_t(out)].type != kernel.buffers[size_t(in)].type) return false;
  if (!kernel.body) return false;
  if (std::optional<bool> known = in_place_answers().find(kernel.body, out, in)) return *known;
  InPlaceCheck check(out, in);
  check.walk(kernel.body);
  const bool in_place = check.in_place();
  in_place_answers().store(kernel.body, out, in, in_place);
  return in_place;
}

}  // namespace tessera::kir
