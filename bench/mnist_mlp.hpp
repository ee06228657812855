// The benchmarks' MNIST MLP (784-700-500-10, ReLU, Adam 1e-3) and its jit training step, on any
// mesh: the same model for the CPU (training_bench) and GPU (gpu_bench) numbers.
#pragma once

#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::bench {

struct MnistMlp {
  Dense l1, l2, l3;
  std::vector<Variable> vars;
  Adam adam;
  explicit MnistMlp(const Mesh& mesh)
      : l1(784, 700, Layout::replicated(mesh, 2), 1, [](const Tensor& x) { return relu(x); }),
        l2(700, 500, Layout::replicated(mesh, 2), 2, [](const Tensor& x) { return relu(x); }),
        l3(500, 10, Layout::replicated(mesh, 2), 3),
        vars{l1.weight(), l1.bias(), l2.weight(), l2.bias(), l3.weight(), l3.bias()},
        adam(vars, 1e-3) {}
  // step(x, y) -> loss: one Adam step on the batch.
  auto step() {
    return jit([this](const Tensor& x, const Tensor& y) {
      Tensor loss = reduce_mean(sparse_softmax_cross_entropy_with_logits(y, l3(l2(l1(x)))));
      adam.apply(grad(loss, vars));
      return loss;
    });
  }
};

}  // namespace tessera::bench
