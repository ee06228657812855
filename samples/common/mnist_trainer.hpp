// The Fashion-MNIST training program shared by samples/mnist_dp and samples/mnist_tp: options,
// the MLP 784-700-500-10 with ReLU, Adam, the jit'd train and eval steps, a progress bar,
// per-epoch metrics (CSV and a gnuplot plot) and checkpoints. The samples differ only in the
// mesh and the weights' layouts.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <tessera/tessera.hpp>

#include "gnuplot.hpp"
#include "progress_line.hpp"
#include "report_errors.hpp"

namespace mnist {

using namespace tessera;
using Clock = std::chrono::steady_clock;

struct Options {
  int devices = 0;  // 0: one per core on CPU, one per GPU on GPU
  std::string device = "cpu";
  int epochs = 3;
  int64_t batch_size = 128;
  double lr = 1e-3;
  int64_t train_limit = -1;
  uint64_t seed = 22;
  std::string out = "mnist_out";
  std::string checkpoint;
  bool resume = false;
  double expect_accuracy = -1;
};

struct EpochMetrics { double loss = 0, accuracy = 0, seconds = 0; int64_t samples = 0; };

inline samples::ProgressLine& progress_line() {
  static samples::ProgressLine line;
  return line;
}

void progress(int epoch, int64_t done, int64_t total, double loss, double acc, double samples_per_s) {
  if (client_id() != 0) return;
  fmt::print("{}", progress_line().update(done, total, fmt::format("epoch {}", epoch),
                                          fmt::format("{}/{} loss {:.4f} acc {:.4f} {:.0f} samples/s", done, total, loss, acc, samples_per_s)));
  std::fflush(stdout);
}

// Builds the mesh and the three weight layouts from the device count.
struct Placement {
  Mesh mesh;
  Layout w1, w2, w3;
};

inline int run_unguarded(int argc, char** argv, const std::string& title, const std::function<Placement(int devices)>& place) {
  init(argc, argv);
  Options o;
  CLI::App app{title};
  app.add_option("--devices", o.devices, "virtual devices on the batch mesh dim (default: one per core, or per GPU)");
  app.add_option("--device", o.device, "the mesh's device type")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--epochs", o.epochs);
  app.add_option("--batch-size", o.batch_size, "global batch size");
  app.add_option("--lr", o.lr, "Adam learning rate");
  app.add_option("--train-limit", o.train_limit, "use only the first N training images");
  app.add_option("--seed", o.seed, "initialisation and shuffling seed");
  app.add_option("--out", o.out, "directory for metrics.csv and the plot");
  app.add_option("--checkpoint", o.checkpoint, "save the model here at the end");
  app.add_flag("--resume", o.resume, "start from --checkpoint");
  app.add_option("--expect-accuracy", o.expect_accuracy, "fail unless the loss falls and the final test accuracy reaches this");
  CLI11_PARSE(app, argc, argv);

  // Meshes made without a device list take this type (dsl/mesh.hpp).
  setenv("TESSERA_DEVICE_TYPE", o.device == "gpu" ? "GPU" : "CPU", 1);
  if (o.devices == 0)
    o.devices = o.device == "gpu" ? std::max(1, int(gpu_devices().size())) : std::max(1, int(std::thread::hardware_concurrency()));
  Placement placement = place(o.devices);
  const Mesh& mesh = placement.mesh;
  Dataset train = load_fashion_mnist(true, o.train_limit), test = load_fashion_mnist(false);
  // Under mpirun every client runs this program; client 0 does the talking.
  auto say = [](const std::string& text) {
    if (client_id() == 0) fmt::print("{}", text);
  };
  say(fmt::format("Fashion-MNIST: {} train / {} test images; mesh {}; batch {}\n", train.size(), test.size(), mesh.to_string(), o.batch_size));

  Dense l1(784, 700, placement.w1, o.seed, [](const Tensor& x) { return relu(x); });
  Dense l2(700, 500, placement.w2, o.seed + 1, [](const Tensor& x) { return relu(x); });
  Dense l3(500, 10, placement.w3, o.seed + 2);
  std::vector<Variable> vars = {l1.weight(), l1.bias(), l2.weight(), l2.bias(), l3.weight(), l3.bias()};
  std::map<std::string, Variable> named = {{"dense1/w", l1.weight()}, {"dense1/b", l1.bias()}, {"dense2/w", l2.weight()},
                                           {"dense2/b", l2.bias()}, {"dense3/w", l3.weight()}, {"dense3/b", l3.bias()}};
  Adam adam(vars, o.lr);
  // The optimizer's state goes into the checkpoint too, so a resumed run continues exactly.
  const std::vector<std::string> names = {"dense1/w", "dense1/b", "dense2/w", "dense2/b", "dense3/w", "dense3/b"};
  for (size_t i = 0; i < names.size(); ++i) {
    named.emplace("adam/m/" + names[i], adam.first_moments()[i]);
    named.emplace("adam/v/" + names[i], adam.second_moments()[i]);
  }
  named.emplace("adam/step", adam.step());
  if (o.resume) {
    load(o.checkpoint, named);
    say(fmt::format("resumed from {}\n", o.checkpoint));
  }
  auto model = [&](const Tensor& x) { return l3(l2(l1(x))); };
  auto train_step = jit([&](const Tensor& x, const Tensor& y) {
    Tensor logits = model(x);
    Tensor loss = reduce_mean(sparse_softmax_cross_entropy_with_logits(y, logits));
    adam.apply(grad(loss, vars));
    return std::make_tuple(loss, accuracy(logits, y));
  });
  auto eval_step = jit([&](const Tensor& x, const Tensor& y) {
    Tensor logits = model(x);
    return std::make_tuple(reduce_mean(sparse_softmax_cross_entropy_with_logits(y, logits)), accuracy(logits, y));
  });

  const std::string out_dir = client_id() == 0 ? o.out : o.out + "/client" + std::to_string(client_id());
  std::filesystem::create_directories(out_dir);
  // Made afresh and renamed into place: a link planted at metrics.csv is replaced, not followed.
  samples::OutputFile metrics = samples::OutputFile::replacing(out_dir, "metrics.csv");
  metrics.commit();
  std::vector<double> batch_losses;
  double final_test_accuracy = 0;
  metrics.write("epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds,samples_per_second\n");
  Batches train_batches(train, o.batch_size, mesh, "batch", o.seed), test_batches(test, o.batch_size, mesh, "batch", o.seed);
  auto scalar = [](const Tensor& t) { return double(to_array(t).to_vector<float>()[0]); };
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    train_batches.shuffle(epoch);
    EpochMetrics tr, te;
    auto start = Clock::now();
    for (int64_t b = 0; b < train_batches.count(); ++b) {
      auto [x, y] = train_batches.get(b);
      auto [loss, acc] = train_step(x, y);
      const int64_t n = x.shape()[0];
      batch_losses.push_back(scalar(loss));
      tr.loss += batch_losses.back() * double(n);
      tr.accuracy += scalar(acc) * double(n);
      tr.samples += n;
      tr.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (b % 10 == 0 || b + 1 == train_batches.count())
        progress(epoch, tr.samples, train.size(), tr.loss / tr.samples, tr.accuracy / tr.samples, tr.samples / tr.seconds);
    }
    for (int64_t b = 0; b < test_batches.count(); ++b) {
      auto [x, y] = test_batches.get(b);
      auto [loss, acc] = eval_step(x, y);
      const int64_t n = x.shape()[0];
      te.loss += scalar(loss) * double(n);
      te.accuracy += scalar(acc) * double(n);
      te.samples += n;
    }
    tr.loss /= tr.samples, tr.accuracy /= tr.samples, te.loss /= te.samples, te.accuracy /= te.samples;
    final_test_accuracy = te.accuracy;
    say(progress_line().end_line() + fmt::format("Epoch {}: training loss {:.3f}, training accuracy {:.3f}, testing loss {:.3f}, testing accuracy {:.3f} ({:.1f} s, {:.0f} samples/s)\n",
                    epoch, tr.loss, tr.accuracy, te.loss, te.accuracy, tr.seconds, tr.samples / tr.seconds));
    metrics.write(fmt::format("{},{:.6f},{:.6f},{:.6f},{:.6f},{:.3f},{:.1f}\n", epoch, tr.loss, tr.accuracy, te.loss, te.accuracy,
                              tr.seconds, tr.samples / tr.seconds));
  }
  if (client_id() == 0)
    samples::plot_metrics(out_dir, "metrics.csv", "epoch", {{"loss", {{2, "train"}, {4, "test"}}}, {"accuracy", {{3, "train"}, {5, "test"}}}});
  if (!o.checkpoint.empty()) {
    save(o.checkpoint, named);
    say(fmt::format("checkpoint: {}\n", o.checkpoint));
  }
  if (o.expect_accuracy >= 0) {
    const size_t k = std::max<size_t>(1, batch_losses.size() / 4);
    double first = 0, last = 0;
    for (size_t i = 0; i < k; ++i) first += batch_losses[i] / double(k), last += batch_losses[batch_losses.size() - 1 - i] / double(k);
    say(fmt::format("loss over the first {} batches {:.3f}, last {} batches {:.3f}; test accuracy {:.3f} (expected >= {})\n", k,
                    first, k, last, final_test_accuracy, o.expect_accuracy));
    if (!(last < first) || final_test_accuracy < o.expect_accuracy) return 1;
  }
  return 0;
}

// run_unguarded, with errors printed and a non-zero exit instead of an abort.
inline int run(int argc, char** argv, const std::string& title, const std::function<Placement(int devices)>& place) {
  return samples::report_errors([&] { return run_unguarded(argc, argv, title, place); });
}

}  // namespace mnist
