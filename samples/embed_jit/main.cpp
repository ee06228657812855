// A small C++ application embedding Tessera: a jit-compiled scoring function (a two-layer
// network with softmax) called in a loop on batches that arrive from the application, sharded
// over the machine's cores as virtual devices.
#include <fmt/core.h>

#include <chrono>
#include <thread>

#include <tessera/tessera.hpp>

#include "../common/report_errors.hpp"

using namespace tessera;

static int run_sample(int argc, char** argv) {
  init(argc, argv);
  const int devices = std::max(1, int(std::thread::hardware_concurrency()));
  Mesh mesh = create_mesh({{"batch", devices}});
  Layout weights2 = Layout::replicated(mesh, 2), weights1 = Layout::replicated(mesh, 1);
  Layout rows({"batch", UNSHARDED}, mesh);

  // Model parameters, drawn once (stateless random: the same values on any number of devices).
  Tensor w1 = random_normal({32, 64}, 1, weights2, 0, 0.2), b1 = zeros({64}, weights1);
  Tensor w2 = random_normal({64, 10}, 2, weights2, 0, 0.2), b2 = zeros({10}, weights1);

  // Traced and compiled on the first call; later calls only run the compiled program.
  auto score = jit([&](const Tensor& x) {
    Tensor h = relu(matmul(x, w1) + b1);
    Tensor p = softmax(matmul(h, w2) + b2);
    return std::make_tuple(argmax(p, 1), reduce_max(p, {1}));
  });

  for (int batch = 0; batch < 5; ++batch) {
    // The application's data: a batch of 256 feature vectors, sharded over the devices.
    std::vector<float> features(256 * 32);
    for (size_t i = 0; i < features.size(); ++i) features[i] = float((i * 7919 + size_t(batch) * 104729) % 2000) / 1000.0f - 1.0f;
    Tensor x = copy_to_mesh(Array::from(features, {256, 32}), rows);
    auto start = std::chrono::steady_clock::now();
    auto [label, confidence] = score(x);
    Array labels = label.full_tensor(), conf = confidence.full_tensor();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    fmt::print("batch {}: first labels {} {} {}, mean confidence {:.3f}, {:.0f} us\n", batch, labels.to_vector<int64_t>()[0],
               labels.to_vector<int64_t>()[1], labels.to_vector<int64_t>()[2], to_array(reduce_mean(confidence)).to_vector<float>()[0], us);
  }
  fmt::print("traced {} time(s) for {} calls\n", score.traces(), 5);
  fmt::print("\nper-device plan:\n{}", score.explain(zeros({256, 32}, rows)));
  return 0;
}

int main(int argc, char** argv) { return samples::report_errors([&] { return run_sample(argc, argv); }); }
