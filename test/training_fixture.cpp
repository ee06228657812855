#include "training_fixture.hpp"

namespace tessera::testing {

SmallMlp::SmallMlp(const Layout& w1_layout, const Layout& w2_layout)
    : l1(12, 16, w1_layout, 5, [](const Tensor& x) { return relu(x); }),
      l2(16, 4, w2_layout, 6),
      vars{l1.weight(), l1.bias(), l2.weight(), l2.bias()},
      adam(vars, 0.01) {}

Tensor SmallMlp::train_step(const Tensor& x, const Tensor& labels) {
  Tensor loss = reduce_mean(sparse_softmax_cross_entropy_with_logits(labels, l2(l1(x))));
  adam.apply(grad(loss, vars));
  return loss;
}

std::vector<float> train_losses(const Mesh& mesh, const Layout& w1_layout, const Layout& w2_layout, const std::string& batch_dim,
                                int steps) {
  SmallMlp model(w1_layout, w2_layout);
  auto step = jit([&](const Tensor& x, const Tensor& y) { return model.train_step(x, y); });
  Layout rows = Layout::batch_sharded(mesh, batch_dim, 2), labels_layout = Layout::batch_sharded(mesh, batch_dim, 1);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor x = random_normal({20, 12}, 100 + uint64_t(s), rows);
    Array y(std::vector<int64_t>{20}, DType::i32);
    for (int i = 0; i < 20; ++i) y.mutable_data<int32_t>()[i] = (i * 7 + s) % 4;
    losses.push_back(to_array(step(x, copy_to_mesh(y, labels_layout))).to_vector<float>()[0]);
  }
  return losses;
}

}  // namespace tessera::testing
