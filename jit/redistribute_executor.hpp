// Runs redistribute plans (partitioner/redistribute_plan.hpp) on a tensor's components: every
// step runs on all local devices in parallel, each on its worker thread, using the mesh-dim
// communicators; each collective step is counted once in CommDebugMode.
#pragma once

#include <vector>

#include "dsl/tensor.hpp"
#include "partitioner/redistribute_plan.hpp"

namespace tessera {

Tensor execute_redistribute(const Tensor& tensor, const Layout& target);

// The local-partial rule (Replicate -> Partial) applied to per-device components of a
// replicated-valued tensor, for every Partial mesh dim of `layout`.
std::vector<Array> apply_partial_rule(std::vector<Array> components, const Layout& layout);

}  // namespace tessera
