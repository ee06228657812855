// Normalisations over the last axis of a tensor (PyTorch's F.layer_norm and F.rms_norm with
// normalized_shape = the last axis), built from primitive ops: a sharded last axis reduces
// across its shards (one all_reduce of the per-row statistics), any other axis needs nothing.
#pragma once

#include <optional>

#include "dsl/ops.hpp"

namespace tessera {

// (x - mean) / sqrt(var + eps) * weight + bias, mean and biased variance over the trailing axes
// that weight and bias span (PyTorch's normalized_shape is their shape; the last axis when both
// are left out). Their shape must be x's trailing extents (ShapeError otherwise).
Tensor layer_norm(const Tensor& x, const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5, Loc where = Loc::current());
// The same over the trailing axes of extents `normalized_shape` (F.layer_norm's argument).
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5, Loc where = Loc::current());
// x / sqrt(mean(x^2) + eps) * weight over the last axis.
Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight = std::nullopt, double eps = 1e-6,
                Loc where = Loc::current());

}  // namespace tessera
