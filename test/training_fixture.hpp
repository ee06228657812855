// A small training run shared by the training and multi-client tests: `steps` Adam steps of an
// MLP 12-16-4 (ReLU, softmax cross-entropy) on a batch of 20 sharded over `batch_dim`, returning
// the loss of every step.
#pragma once

#include <string>
#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::testing {

std::vector<float> train_losses(const Mesh& mesh, const Layout& w1_layout, const Layout& w2_layout, const std::string& batch_dim,
                                int steps);

}  // namespace tessera::testing
