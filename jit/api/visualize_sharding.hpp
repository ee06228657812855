// visualize_sharding (PyTorch's debug helper): a terminal table of which devices hold which
// block of a 1-D or 2-D tensor. Blocks held by several devices (replication) list them all.
#pragma once

#include <string>

#include "dsl/tensor.hpp"

namespace tessera {

std::string visualize_sharding(const Tensor& t, const std::string& header = "");

}  // namespace tessera
