// Metrics of the MNIST tutorial.
#pragma once

#include "dsl/ops.hpp"

namespace tessera {

// Fraction of rows whose argmax over the last axis equals the label.
Tensor accuracy(const Tensor& logits, const Tensor& labels, Loc where = Loc::current());

}  // namespace tessera
