// Reverse-mode automatic differentiation on the global graph. grad(loss, wrt) walks the graph
// from `loss` back to the `wrt` tensors, applying one vector-Jacobian rule per primitive op, and
// returns graph nodes (nothing runs): eager code and jit traces differentiate the same way.
// The gradient of a non-scalar loss is that of the sum of its elements. Backward nodes carry the
// forward op's source line, so explain() attributes their collectives to the user's code.
#pragma once

#include <optional>
#include <vector>

#include "dsl/tensor.hpp"

namespace tessera {

// d(sum of loss) / d(each of wrt). A tensor the loss does not depend on gets zeros. A layout
// given for an entry constrains that gradient (Variables' gradients come out in their layouts).
std::vector<Tensor> gradients(const Tensor& loss, const std::vector<Tensor>& wrt,
                              const std::vector<std::optional<Layout>>& layouts = {});

// A gradient handed out in `wanted` (as gradients() hands each one out): a hint, not a
// constraint. Consumers inside a larger program take it in whatever layout is cheapest, but a
// partial sum that several read (clipping measures and scales it, the optimizer reads it) is
// reduced once, into this layout. For gradients summed by hand (a pipeline's microbatches).
Tensor hand_out_gradient(const Tensor& g, const Layout& wanted);

// A handed-out gradient's value as the backward computed it, in its layout there (a sum still
// pending over dp, say); any other tensor as it is. What a sum carried from one program to the
// next keeps (gradient accumulation over calls, nn/transformer_training_step.hpp), so that it is
// reduced once, when handed out again.
Tensor gradient_as_computed(const Tensor& g);

}  // namespace tessera
