// The transformer's layers as Modules: Embedding, RMSNorm and LayerNorm (Dense is nn/dense.hpp,
// Linear nn/linear.hpp). Their
// parameters start replicated on a mesh; parallelize_module / fully_shard shard them.
#pragma once

#include <cstdint>

#include "dsl/mesh.hpp"
#include "nn/module.hpp"

namespace tessera {

// Rows of "weight" [num_embeddings, dim] (normal, std 0.02, stateless: the same on any mesh).
// RowwiseParallel shards the vocabulary (ids outside a shard give zeros there, the partial
// sums add up), ColwiseParallel the embedding dim.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, const Mesh& mesh, uint64_t seed);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;  // ids -> ids.shape + [dim]
};

// rms_norm over the last axis with "weight" (ones), Llama's norm (PyTorch's nn.RMSNorm).
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, const Mesh& mesh, double eps = 1e-6);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  double eps_;
};

// layer_norm over the last axis with "weight" (ones) and "bias" (zeros).
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, const Mesh& mesh, double eps = 1e-5);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  double eps_;
};

}  // namespace tessera
