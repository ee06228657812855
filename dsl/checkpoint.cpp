#include "dsl/checkpoint.hpp"

#include "dsl/node.hpp"

namespace tessera {
namespace {

thread_local std::shared_ptr<const CheckpointRegion> current_region;

}  // namespace

const char* checkpoint_policy_name(CheckpointPolicy policy) { return policy == CheckpointPolicy::Full ? "full" : "selective"; }

bool CheckpointRegion::recomputes(const Node& node) const {
  if (node.op == OpKind::Leaf) return false;  // a value that exists: nothing to compute
  if (policy == CheckpointPolicy::Full) return true;
  switch (op_category(node.op)) {
    case OpCategory::Dot:
    case OpCategory::Attention: return false;
    default: return !is_functional_collective(node.op) && node.op != OpKind::MeshTransfer;
  }
}

CheckpointScope::CheckpointScope(CheckpointPolicy policy) : previous_(current_region) {
  auto region = std::make_shared<CheckpointRegion>();
  region->policy = policy;
  current_region = std::move(region);
}

CheckpointScope::~CheckpointScope() { current_region = std::move(previous_); }

std::shared_ptr<const CheckpointRegion> current_checkpoint_region() { return current_region; }

}  // namespace tessera
