// PyTorch's nn.Linear as Llama-family models use it: y = x @ weight (+ bias), bias off by default.
// "weight" is [in_dim, out_dim] (Tessera's layout for matmul(x, w), as Dense's), so
// ColwiseParallel / RowwiseParallel shard it as they shard Dense; transpose PyTorch's [out, in]
// when loading its checkpoints. Parameters start replicated on `mesh`, drawn as PyTorch draws
// them (uniform on +-1/sqrt(in_dim)) from a stateless stream: the same values on any mesh.
#pragma once

#include <cstdint>
#include <vector>

#include "dsl/mesh.hpp"
#include "nn/module.hpp"

namespace tessera {

class Linear : public Module {
 public:
  Linear(int64_t in_dim, int64_t out_dim, const Mesh& mesh, uint64_t seed, bool bias = false);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;  // [..., in] -> [..., out]

 private:
  bool bias_;
};

}  // namespace tessera
