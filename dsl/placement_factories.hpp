// PyTorch's torch.distributed.tensor factories: zeros / ones / empty / full / rand / randn given
// a device mesh and placements (default: Replicate on every mesh dim). They are the Layout
// factories of ops.hpp under PyTorch's spelling; rand and randn draw their seeds from a
// process-wide generator set by manual_seed, so SPMD programs (every client making the same
// calls) agree, and values never depend on the placements.
#pragma once

#include <cstdint>
#include <vector>

#include "dsl/ops.hpp"

namespace tessera {

Tensor zeros(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
             DType dtype = DType::f32, Loc where = Loc::current());
Tensor ones(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
            DType dtype = DType::f32, Loc where = Loc::current());
Tensor empty(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
             DType dtype = DType::f32, Loc where = Loc::current());
Tensor full(std::vector<int64_t> shape, double value, const Mesh& mesh, std::vector<Placement> placements = {},
            DType dtype = DType::f32, Loc where = Loc::current());
// Uniform on [0, 1) and standard normal.
Tensor rand(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
            DType dtype = DType::f32, Loc where = Loc::current());
Tensor randn(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
             DType dtype = DType::f32, Loc where = Loc::current());

// PyTorch's torch.manual_seed for rand / randn: the same seed gives the same sequence of tensors.
void manual_seed(uint64_t seed);

}  // namespace tessera
