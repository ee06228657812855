#include "codegen/lowering_memo.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "codegen/kernel_verify.hpp"
#include "dsl/cache_key_verification.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

// The key's bytes: fixed-width fields, so no two groups write the same bytes.
class KeyWriter {
 public:
  explicit KeyWriter(std::string& out) : out_(out) {}
  void i64(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void f64(double v) { i64(std::bit_cast<int64_t>(v)); }
  void list(const std::vector<int64_t>& v) {
    i64(int64_t(v.size()));
    for (int64_t x : v) i64(x);
  }
  void dims(const std::vector<SymbolicDim>& v) {
    i64(int64_t(v.size()));
    for (const SymbolicDim& d : v) i64(d.constant), i64(d.param);
  }
  void text(std::string_view s) {
    i64(int64_t(s.size()));
    out_.append(s);
  }

 private:
  std::string& out_;
};

// What lowering reads of a node (codegen/lower_kernel.cpp, codegen/index_arithmetic.cpp): not
// its layout or origin, which name where it lives and where it came from. Its inputs are
// written by the caller, canonically numbered.
void write_node(KeyWriter& w, const LocalNode& n) {
  w.i64(int64_t(n.kind));
  w.i64(int64_t(n.op));
  w.i64(int64_t(n.dtype));
  w.list(n.global_shape);
  w.dims(n.local_shape);
  w.dims(n.local_offset);
  w.i64(n.seed_param);
  const NodeAttrs& a = n.attrs;
  w.list(a.axes);
  w.list(a.lo);
  w.list(a.hi);
  w.f64(a.scalar);
  w.f64(a.scalar2);
  w.i64(int64_t(a.seed));
  w.i64(a.recomputed);
  w.i64(a.extents ? int64_t(a.extents->axes.size()) : -1);
  if (a.extents)
    for (const AxisExtent& e : a.extents->axes) w.i64(e.global), w.list(e.dims);
  if (n.kind == LocalNode::Kind::Redistribute) {
    w.i64(int64_t(n.step.kind));
    w.i64(n.step.mesh_dim);
    w.i64(int64_t(n.step.op));
    w.list(n.step.destinations);
  }
}

// A memo entry: the kernel (buffers bound to canonical positions) or the refusal (at one).
struct Entry {
  std::shared_ptr<const LoweredKernel> kernel;
  std::vector<int> buffer_positions;
  FusionRefusal refusal;  // node: a canonical position; where kernel is null
};

// Process-wide, shared by every thread (a search screens candidates on every core). Bounded:
// past kMostEntries it starts again empty (a search keeps about 5,000).
class Memo {
 public:
  static constexpr size_t kMostEntries = 50'000;

  std::shared_ptr<const Entry> find(const std::string& key) const {
    std::shared_lock lock(mutex_);
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : it->second;
  }
  void store(std::string key, std::shared_ptr<const Entry> entry) {
    std::unique_lock lock(mutex_);
    if (entries_.size() >= kMostEntries) entries_.clear();
    entries_.emplace(std::move(key), std::move(entry));
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Entry>> entries_;
};

Memo& memo() {
  static Memo* m = new Memo;  // never destroyed: threads may lower while the process exits
  return *m;
}

std::atomic<int64_t> lowered_count{0}, reused_count{0};

// The canonical position of program node `node` in `key`, or -1.
int position_of(const GroupKey& key, int node) {
  for (size_t i = 0; i < key.nodes.size(); ++i)
    if (key.nodes[i] == node) return int(i);
  return -1;
}

std::shared_ptr<const Entry> lower_afresh(const LocalProgram& p, const std::vector<int>& roots, const std::vector<bool>& materialised,
                                          kir::LoopTarget target, const GroupKey& key) {
  std::vector<int> buffer_nodes;
  auto lowered = lower_group(p, roots, materialised, buffer_nodes, target);
  auto entry = std::make_shared<Entry>();
  if (auto* refusal = std::get_if<FusionRefusal>(&lowered)) {
    entry->refusal = *refusal;
    entry->refusal.node = position_of(key, refusal->node);
    if (entry->refusal.node < 0) throw InternalError(fmt::format("lowering refused node %{}, outside the group of %{}", refusal->node, roots.front()));
    return entry;
  }
  kir::Kernel& kernel = std::get<kir::Kernel>(lowered);
  kir::verify(kernel);
  std::string text = kernel.to_string();
  entry->kernel = std::make_shared<const LoweredKernel>(LoweredKernel{std::move(kernel), std::move(text)});
  for (int node : buffer_nodes) {
    entry->buffer_positions.push_back(position_of(key, node));
    if (entry->buffer_positions.back() < 0)
      throw InternalError(fmt::format("lowering bound node %{} to a buffer, outside the group of %{}", node, roots.front()));
  }
  return entry;
}

// An entry's description, for a failed verification.
std::string describe(const Entry& e) {
  if (!e.kernel) return fmt::format("refusal at position {}: {}", e.refusal.node, e.refusal.why);
  return fmt::format("buffers at positions [{}]\n{}", fmt::join(e.buffer_positions, ","), e.kernel->text);
}

bool same(const Entry& a, const Entry& b) {
  if (bool(a.kernel) != bool(b.kernel)) return false;
  if (!a.kernel) return a.refusal.node == b.refusal.node && a.refusal.why == b.refusal.why;
  return a.buffer_positions == b.buffer_positions && a.kernel->text == b.kernel->text;
}

}  // namespace

GroupKey group_key(const LocalProgram& p, const std::vector<int>& roots, const std::vector<bool>& materialised, kir::LoopTarget target) {
  GroupKey key;
  KeyWriter w(key.text);
  w.text(p.target.to_string());
  w.text(p.target.arch);
  w.i64(int64_t(p.target.library.bits()));
  w.i64(p.target.deterministic);
  w.i64(int64_t(target));
  w.i64(int64_t(roots.size()));
  // A check_index kernel writes its own node id into the status word (dsl/index_check.hpp).
  if (p.nodes[size_t(roots.front())].op == OpKind::CheckIndex) w.i64(roots.front());
  std::unordered_map<int, int> position;
  auto is_root = [&](int id) { return std::find(roots.begin(), roots.end(), id) != roots.end(); };
  auto visit = [&](int id) {
    auto [it, fresh] = position.try_emplace(id, int(key.nodes.size()));
    if (fresh) key.nodes.push_back(id);
    return it->second;
  };
  for (int r : roots) visit(r);
  // Breadth first over the canonical order: each node's record once, in position order.
  for (size_t i = 0; i < key.nodes.size(); ++i) {
    const int id = key.nodes[i];
    const LocalNode& n = p.nodes[size_t(id)];
    const bool load = materialised[size_t(id)] && !is_root(id);
    w.i64(load);
    write_node(w, n);
    if (load) continue;
    w.i64(int64_t(n.inputs.size()));
    for (int in : n.inputs) w.i64(visit(in));
  }
  return key;
}

std::variant<std::shared_ptr<const LoweredKernel>, FusionRefusal> lower_group_memoised(const LocalProgram& p, const std::vector<int>& roots,
                                                                                      const std::vector<bool>& materialised,
                                                                                      std::vector<int>& buffer_nodes,
                                                                                      kir::LoopTarget target) {
  GroupKey key = group_key(p, roots, materialised, target);
  std::shared_ptr<const Entry> entry = memo().find(key.text);
  if (entry) {
    ++reused_count;
    if (verify_cache_keys()) {
      const std::shared_ptr<const Entry> afresh = lower_afresh(p, roots, materialised, target, key);
      if (!same(*entry, *afresh))
        throw InternalError(fmt::format("lowering memo: the group of %{} lowered to\n{}\nbut its key's entry is\n{}", roots.front(),
                                        describe(*afresh), describe(*entry)));
    }
  } else {
    ++lowered_count;
    entry = lower_afresh(p, roots, materialised, target, key);
    memo().store(std::move(key.text), entry);
  }
  if (!entry->kernel) return FusionRefusal{key.nodes[size_t(entry->refusal.node)], entry->refusal.why};
  buffer_nodes.clear();
  for (int position : entry->buffer_positions) buffer_nodes.push_back(key.nodes[size_t(position)]);
  return entry->kernel;
}

LoweringMemoStats lowering_memo_stats() { return {lowered_count.load(), reused_count.load()}; }

}  // namespace tessera
