// PyTorch's clip_grad_norm_: gradients scaled together so their global 2-norm is at most
// max_norm. Sharded and Partial gradients need nothing special: the norm is an ordinary
// reduction of the global values, so the partitioner sums the shards' squares and settles
// pending sums before squaring.
#pragma once

#include <vector>

#include "dsl/ops.hpp"

namespace tessera {

// Scales `grads` in place by min(1, max_norm / (norm + 1e-6)) and returns the norm before
// clipping (a scalar, replicated). Error when max_norm is not positive.
Tensor clip_grad_norm(std::vector<Tensor>& grads, double max_norm, Loc where = Loc::current());
// The same from the gradients' squared 2-norms (f64 scalars), summed in the order given: a
// model whose parameters are stacked (nn/pipelined_transformer.hpp) lists them block by block, so the
// norm's bits do not depend on how the blocks are stacked.
Tensor clip_grad_norm(std::vector<Tensor>& grads, const std::vector<Tensor>& squares, double max_norm, Loc where = Loc::current());

}  // namespace tessera
