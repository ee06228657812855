#include "codegen/collective_buckets.hpp"

#include <optional>
#include <tuple>
#include <unordered_set>

#include "dsl/element_count.hpp"

namespace tessera {
namespace {

using BucketKey = std::tuple<int64_t, ReduceOp, DType>;  // mesh dim, reduction, element type

// The global extent bounds every device's block.
int64_t global_bytes(const LocalNode& n) { return element_count(n.global_shape) * dtype_size(n.dtype); }

std::optional<BucketKey> bucket_key(const LocalProgram& p, const ScheduledStep& step) {
  if (step.kind != ScheduledStep::Kind::Redistribute) return std::nullopt;
  const LocalNode& n = p.nodes[step.node];
  if (n.step.kind != RedistributeKind::AllReduce) return std::nullopt;
  if (global_bytes(n) > kBucketMemberMaximumBytes) return std::nullopt;
  return BucketKey{n.step.mesh_dim, n.step.op, n.dtype};
}

// Whether a step that reads a member may wait for the bucket while later steps run ahead of it:
// only one whose results are as small as a member (a gradient norm's square sums). A large one
// starts a chain of work (a loss's backward), and the steps that would then run ahead (every
// block's recomputed forward) would hold their activations until it ran.
bool may_wait(const LocalProgram& p, const ScheduledStep& step) {
  int64_t bytes = 0;
  for (int o : step.outputs) bytes += global_bytes(p.nodes[size_t(o)]);
  return bytes <= kBucketMemberMaximumBytes;
}

}  // namespace

void bucket_small_all_reduces(const LocalProgram& p, std::vector<ScheduledStep>& steps) {
  std::vector<ScheduledStep> out, deferred;
  std::vector<int> members;           // step indices of the open bucket
  std::unordered_set<int> pending;    // nodes the bucket or the deferred steps produce
  std::optional<BucketKey> open_key;
  auto flush = [&] {
    if (!members.empty()) {
      ScheduledStep bucket = steps[size_t(members.front())];
      bucket.outputs.clear();
      for (int m : members) bucket.outputs.push_back(steps[size_t(m)].node);
      out.push_back(std::move(bucket));
    }
    out.insert(out.end(), deferred.begin(), deferred.end());
    members.clear();
    deferred.clear();
    pending.clear();
    open_key.reset();
  };
  // A program built in order scopes (dsl/program_order_scope.hpp) runs its parts in order: a
  // bucket closes where its part ends, rather than wait for members or readers in later parts.
  auto part = [&](const ScheduledStep& step) { return p.nodes[size_t(step.node)].origin.program_order; };
  for (size_t s = 0; s < steps.size(); ++s) {
    const ScheduledStep& step = steps[s];
    if (!members.empty() && part(step) != part(steps[size_t(members.front())])) flush();
    bool reads_pending = false;
    for (int r : step_reads(p, step)) reads_pending |= pending.count(r) > 0;
    const auto key = bucket_key(p, step);
    if (key && (reads_pending || (open_key && *key != *open_key))) flush();  // it cannot join: start anew
    if (key) {
      members.push_back(int(s));
      open_key = key;
      pending.insert(step.node);
    } else if (reads_pending && !may_wait(p, step)) {
      flush();
      out.push_back(step);
    } else if (reads_pending) {
      deferred.push_back(step);
      pending.insert(step.outputs.begin(), step.outputs.end());
    } else {
      out.push_back(step);
    }
  }
  flush();
  steps = std::move(out);
}

}  // namespace tessera
