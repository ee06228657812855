// A small training run shared by the training and multi-client tests: `steps` Adam steps of an
// MLP 12-16-4 (ReLU, softmax cross-entropy) on a batch of 20 sharded over `batch_dim`, returning
// the loss of every step.
#pragma once

#include <string>
#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::testing {

// The MLP 12-16-4 (ReLU) and its Adam (lr 0.01); train_step is one step's graph (call it inside jit).
struct SmallMlp {
  Dense l1, l2;
  std::vector<Variable> vars;
  Adam adam;
  SmallMlp(const Layout& w1_layout, const Layout& w2_layout);
  Tensor train_step(const Tensor& x, const Tensor& labels);  // applies Adam, returns the loss
};

std::vector<float> train_losses(const Mesh& mesh, const Layout& w1_layout, const Layout& w2_layout, const std::string& batch_dim,
                                int steps);

}  // namespace tessera::testing
