// PyTorch's tensor parallelism (torch.distributed.tensor.parallel): parallelize_module applies a
// style to each named submodule along one mesh dim (the tensor-parallel dim); every other mesh
// dim keeps the placements tensors already have there (data parallelism, fully_shard).
//
// A style shards a module's parameters named "weight" (Dense's [in, out], an embedding's
// [vocab, dim]) and "bias", and installs hooks that redistribute its input and output on the
// tensor-parallel dim. Placements are for that dim; Shard(-1) counts from the last axis.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dsl/mesh.hpp"
#include "dsl/placement.hpp"
#include "nn/mixed_precision.hpp"
#include "nn/module.hpp"

namespace tessera {

// Output features split: weight Shard(-1), bias Shard(0); the output left as `output_layout`
// (Shard(-1): each device its features). `input_layout` is the placement the input arrives in
// (PyTorch's input_layouts); whatever it is, the layer's input is made Replicate (PyTorch's
// desired_input_layouts), and the input's gradient goes back into its own placement: an input
// arriving Shard(0) is all_gathered forward and its gradient reduce_scattered.
struct ColwiseParallel {
  Placement input_layout = Replicate{};
  Placement output_layout = Shard{-1};
};
// Input features (or an embedding's vocabulary) split: weight Shard(0), bias replicated; the
// input is made `input_layout`, and the partial products summed into `output_layout`
// (Replicate: an all_reduce; Shard(1) for sequence parallelism: a reduce_scatter).
struct RowwiseParallel {
  Placement input_layout = Shard{-1};
  Placement output_layout = Replicate{};
};
// Parameter-free or norm modules run on a sequence shard: parameters replicated, input and
// output Shard(sequence_dim).
struct SequenceParallel {
  int64_t sequence_dim = 1;
};
// Redistributes forward's inputs: one placement each, std::nullopt leaving that input as it is
// (PyTorch's None); an empty list leaves all as they are.
struct PrepareModuleInput {
  std::vector<std::optional<Placement>> desired_input_layouts;
};
// Redistributes forward's outputs likewise (PyTorch's PrepareModuleOutput).
struct PrepareModuleOutput {
  std::vector<std::optional<Placement>> desired_output_layouts;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, PrepareModuleOutput>;
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;  // dotted module path -> style

// Applies each style of `plan` (paths as get_submodule takes them; "" is `module` itself) along
// mesh dim `tp_dim` (default: the mesh's last dim). Error naming the path for an unknown
// module, or for a Colwise/Rowwise module without a "weight".
void parallelize_module(Module& module, const Mesh& mesh, const ParallelizePlan& plan, std::string tp_dim = "");

// PyTorch's FSDP2 fully_shard (ZeRO-3): every parameter of `module` and its submodules is
// sharded along axis 0 over mesh dim `dp_dim` (default: the mesh's first dim), gathered just
// before forward uses it, and its gradient reduce-scattered back to the shard (both planned by
// the partitioner from the layouts). Combines with parallelize_module's tensor parallelism.
void fully_shard(Module& module, const Mesh& mesh, std::string dp_dim = "");
// The same with mixed precision (nn/mixed_precision.hpp): each shard cast to param_dtype before it
// is gathered, gradients reduce_scattered in reduce_dtype, `module`'s floating inputs cast to
// param_dtype and its outputs to output_dtype.
void fully_shard(Module& module, const Mesh& mesh, const MixedPrecisionPolicy& policy, std::string dp_dim = "");

}  // namespace tessera
