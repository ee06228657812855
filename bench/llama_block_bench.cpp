// A small Llama-family Transformer (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU,
// no biases) trained in Tessera next to the same model written with libtorch 1.13 ops, in one
// process on one core each: the same initial weights (copied from Tessera's by name), the same
// random-token batch, cross-entropy loss, backward and AdamW. Both first compute the loss of the
// untrained model on that batch, and must agree to 1e-4 relative (the benchmark's correctness
// guard); then the median step time of each, timed in alternating rounds so that a slow spell
// of the machine lands on both, and the median of the rounds' ratios (steadier than the ratio of
// the medians when other work shares the machine).
// Usage: llama_block_bench [--layers 1,2] [--steps N] [--rounds R] [--batch-size B] [--seq T]
//        [--dim C] [--heads H] [--kv-heads K] [--vocab V] [--tessera-attention flash|math]
//        (--tessera-attention: Tessera's attention backend forced, to see what each costs here;
//        by default it picks, as scaled_dot_product_attention does)
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <fmt/core.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"

#include "torch_peer.hpp"

using namespace tessera;

namespace {

struct Setup {
  std::vector<int64_t> layers = {1, 2};
  int64_t steps = 2, rounds = 8, batch_size = 8, seq = 256, dim = 256, heads = 8, kv_heads = 4, vocab = 96;
  double lr = 1e-3;
  uint64_t seed = 1;
};

// Llama's layout is TransformerConfig's default (RMSNorm, rotary, SwiGLU, no biases).
TransformerConfig llama_config(const Setup& s, int64_t layers) {
  TransformerConfig c;
  c.name = "llama-block-bench";
  c.vocab = s.vocab, c.dim = s.dim, c.layers = layers, c.heads = s.heads, c.kv_heads = s.kv_heads;
  c.hidden = swiglu_hidden_size(s.dim, 32);
  c.max_seq = s.seq, c.seed = s.seed;
  return c;
}

// Uniformly random tokens: ids [B, T] and their next tokens as targets. No dataset needed, the
// step's cost does not depend on the values.
struct TokenBatch {
  Array ids, targets;
  explicit TokenBatch(const Setup& s) {
    std::mt19937_64 rng(s.seed);
    std::uniform_int_distribution<int32_t> token(0, int32_t(s.vocab - 1));
    std::vector<int32_t> ids_data, target_data;
    for (int64_t b = 0; b < s.batch_size; ++b) {
      std::vector<int32_t> row(size_t(s.seq + 1));
      for (int32_t& t : row) t = token(rng);
      ids_data.insert(ids_data.end(), row.begin(), row.end() - 1);
      target_data.insert(target_data.end(), row.begin() + 1, row.end());
    }
    ids = Array::from<int32_t>(ids_data, {s.batch_size, s.seq});
    targets = Array::from<int32_t>(target_data, {s.batch_size, s.seq});
  }
};

// AdamW's settings in both frameworks: betas 0.9 / 0.95, eps 1e-8, weight decay 0.1.
constexpr double kBeta1 = 0.9, kBeta2 = 0.95, kEpsilon = 1e-8, kWeightDecay = 0.1;

// Tessera's model on a 1-device mesh and its jit-compiled training step.
struct TesseraLlama {
  Mesh mesh;
  Transformer model;
  std::vector<Variable> params;
  AdamW optimizer;
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  JitFunction<Step> train_step;
  Tensor ids, targets;

  TesseraLlama(const TransformerConfig& c, const Setup& s, const TokenBatch& batch)
      : mesh(create_mesh({{"x", 1}})),
        model(c, mesh),
        params(model.parameters()),
        optimizer(params, s.lr, kBeta1, kBeta2, kEpsilon, kWeightDecay),
        train_step(Step([this](const Tensor& ids, const Tensor& targets) {
          const Tensor loss = cross_entropy(model(ids), targets);
          optimizer.apply(gradients(loss, std::vector<Tensor>(params.begin(), params.end())));
          return loss;
        })),
        ids(distribute_tensor(batch.ids, mesh, {Replicate{}})),
        targets(distribute_tensor(batch.targets, mesh, {Replicate{}})) {}

  // One step; the loss before its update (read back, so the step has finished).
  double step() { return double(train_step(ids, targets).full_tensor().data<float>()[0]); }
};

#if TESSERA_BENCH_TORCH
// The same model in libtorch 1.13 ops: RMSNorm by hand (torch has no rms_norm before 2.4),
// rotate_half RoPE on Tessera's own tables, grouped-query attention by repeat_interleave of k
// and v, an explicit causal mask (scaled_dot_product_attention came in 2.0). Weights [in, out].
struct TorchLlama {
  TransformerConfig config;
  bench::TorchParameters p;
  torch::optim::AdamW optimizer;
  torch::Tensor cos, sin;  // [1, T, 1, head_dim]: each table repeated over both halves of a head
  torch::Tensor causal_mask, ids, targets;

  TorchLlama(const TransformerConfig& c, const Setup& s, const TesseraLlama& initial, const TokenBatch& batch)
      : config(c),
        p(initial.model),
        optimizer(p.ordered, torch::optim::AdamWOptions(s.lr).betas({kBeta1, kBeta2}).eps(kEpsilon).weight_decay(kWeightDecay)),
        causal_mask(torch::ones({s.seq, s.seq}, torch::kBool).triu(1)),
        ids(bench::torch_indices(batch.ids)),
        targets(bench::torch_indices(batch.targets)) {
    const RotaryTables tables = rotary_tables(c, s.seq, initial.mesh);
    auto both_halves = [&](const Tensor& table) {
      const torch::Tensor t = bench::torch_floats(to_array(table));
      return torch::cat({t, t}, -1).view({1, s.seq, 1, c.head_dim()});
    };
    cos = both_halves(tables.cos), sin = both_halves(tables.sin);
  }

  torch::Tensor linear(const torch::Tensor& x, const std::string& name) { return torch::matmul(x, p[name + ".weight"]); }
  torch::Tensor rms_norm(const torch::Tensor& x, const std::string& name) {
    return x * torch::rsqrt(x.pow(2).mean(-1, true) + config.norm_eps) * p[name + ".weight"];
  }
  // Hugging Face's apply_rotary_pos_emb on x [B, T, heads, head_dim].
  torch::Tensor rotary(const torch::Tensor& x) {
    const int64_t half = x.size(-1) / 2;
    const torch::Tensor rotated_half = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * cos + rotated_half * sin;
  }
  torch::Tensor attention(const torch::Tensor& x, const std::string& name) {
    const int64_t b = x.size(0), t = x.size(1), h = config.heads, kv = config.kv_heads, d = config.head_dim();
    const torch::Tensor q = rotary(linear(x, name + ".wq").view({b, t, h, d})).transpose(1, 2);
    // Each kv head serves h / kv consecutive query heads.
    const torch::Tensor k = rotary(linear(x, name + ".wk").view({b, t, kv, d})).transpose(1, 2).repeat_interleave(h / kv, 1);
    const torch::Tensor v = linear(x, name + ".wv").view({b, t, kv, d}).transpose(1, 2).repeat_interleave(h / kv, 1);
    torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
    scores = scores.masked_fill(causal_mask.slice(0, 0, t).slice(1, 0, t), -std::numeric_limits<float>::infinity());
    const torch::Tensor attended = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).contiguous().view({b, t, h * d});
    return linear(attended, name + ".wo");
  }
  torch::Tensor feed_forward(const torch::Tensor& x, const std::string& name) {
    return linear(torch::silu(linear(x, name + ".w1")) * linear(x, name + ".w3"), name + ".w2");
  }
  torch::Tensor loss() {
    const int64_t b = ids.size(0), t = ids.size(1);
    torch::Tensor x = p["tok_embeddings.weight"].index_select(0, ids.view({-1})).view({b, t, config.dim});
    for (int64_t l = 0; l < config.layers; ++l) {
      const std::string block = "layers." + std::to_string(l) + ".";
      x = x + attention(rms_norm(x, block + "attention_norm"), block + "attention");
      x = x + feed_forward(rms_norm(x, block + "ffn_norm"), block + "feed_forward");
    }
    const torch::Tensor logits = linear(rms_norm(x, "norm"), "output");
    return torch::nn::functional::cross_entropy(logits.view({-1, config.vocab}), targets.view({-1}));
  }
  double step() {
    optimizer.zero_grad();
    torch::Tensor l = loss();
    l.backward();
    optimizer.step();
    return l.item<double>();
  }
};
#endif

double seconds_of(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#if TESSERA_BENCH_TORCH
double relative_difference(double a, double b) { return std::abs(a - b) / std::abs(b); }

// The guard's tolerance: f32 sums in different orders, not a different model.
constexpr double kLossTolerance = 1e-4;
#endif

// One model size: the loss check, then the timed steps. False when the losses disagree.
bool compare(const Setup& s, int64_t layers, const TokenBatch& batch) {
  const TransformerConfig config = llama_config(s, layers);
  fmt::print("\nLlama, {} block{}: dim {}, {} heads, {} kv heads, SwiGLU hidden {}, batch {} x seq {}, vocabulary {}, {:.2f}M parameters; AdamW\n",
             layers, layers == 1 ? "" : "s", config.dim, config.heads, config.kv_heads, config.hidden, s.batch_size, s.seq, config.vocab,
             double(parameter_count(config)) / 1e6);
  TesseraLlama tessera(config, s, batch);
#if TESSERA_BENCH_TORCH
  TorchLlama peer(config, s, tessera, batch);  // before Tessera steps: the same start
#endif
  // The first step's loss is the untrained model's on the batch; that step also compiles.
  const double tessera_first = tessera.step();
  std::vector<double> tessera_times;
  double tessera_last = 0;
#if TESSERA_BENCH_TORCH
  const double torch_first = peer.step();
  const double first_difference = relative_difference(tessera_first, torch_first);
  fmt::print("loss of the untrained model: Tessera {:.6f}, libtorch {:.6f} (relative difference {:.1e})\n", tessera_first, torch_first,
             first_difference);
  if (!(first_difference <= kLossTolerance)) {
    fmt::print("the losses differ by more than {:.0e}: the two models do not compute the same thing; no timings\n", kLossTolerance);
    return false;
  }
  std::vector<double> torch_times, round_ratios;
  double torch_last = 0;
  (void)peer.step();  // a warm-up step each
#else
  fmt::print("loss of the untrained model: Tessera {:.6f}\n", tessera_first);
#endif
  (void)tessera.step();
  for (int64_t round = 0; round < s.rounds; ++round) {
    for (int64_t i = 0; i < s.steps; ++i) tessera_times.push_back(seconds_of([&] { tessera_last = tessera.step(); }));
#if TESSERA_BENCH_TORCH
    for (int64_t i = 0; i < s.steps; ++i) torch_times.push_back(seconds_of([&] { torch_last = peer.step(); }));
    auto this_round = [&](const std::vector<double>& times) { return median({times.end() - s.steps, times.end()}); };
    round_ratios.push_back(this_round(torch_times) / this_round(tessera_times));
#endif
  }
  const double tessera_step = median(tessera_times);
  fmt::print("{:<42} step {:8.2f} ms\n", "Tessera, 1 device (1 core)", tessera_step * 1e3);
#if TESSERA_BENCH_TORCH
  const double torch_step = median(torch_times);
  fmt::print("{:<42} step {:8.2f} ms\n", "libtorch 1.13, 1 thread, flush-to-zero", torch_step * 1e3);
  fmt::print("Tessera is {:.2f}x libtorch's speed (libtorch / Tessera step time); rounds' ratios {:.2f}x median, {:.2f}-{:.2f}x\n",
             torch_step / tessera_step, median(round_ratios), *std::min_element(round_ratios.begin(), round_ratios.end()),
             *std::max_element(round_ratios.begin(), round_ratios.end()));
  fmt::print("loss at step {}: Tessera {:.6f}, libtorch {:.6f} (relative difference {:.1e})\n", 2 + s.rounds * s.steps, tessera_last,
             torch_last, relative_difference(tessera_last, torch_last));
#else
  fmt::print("loss at step {}: Tessera {:.6f}\nlibtorch: not built (install libtorch-dev and reconfigure)\n", 2 + s.rounds * s.steps,
             tessera_last);
#endif
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  CLI::App app{"A Llama-family block's training step: Tessera and libtorch on the same weights and batch"};
  app.add_option("--layers", s.layers, "blocks of each model compared, e.g. 1,2")->delimiter(',');
  app.add_option("--steps", s.steps, "timed steps per round and framework");
  app.add_option("--rounds", s.rounds, "rounds, each framework's steps in turn");
  app.add_option("--batch-size", s.batch_size);
  app.add_option("--seq", s.seq);
  app.add_option("--dim", s.dim);
  app.add_option("--heads", s.heads);
  app.add_option("--kv-heads", s.kv_heads);
  app.add_option("--vocab", s.vocab);
  std::string attention_backend;
  app.add_option("--tessera-attention", attention_backend, "force Tessera's attention backend")->check(CLI::IsMember({"flash", "math"}));
  CLI11_PARSE(app, argc, argv);
  if (s.steps < 1 || s.rounds < 1) {
    fmt::print(stderr, "--steps and --rounds must be at least 1\n");
    return 2;
  }

  // One core each: Tessera's device owns one, libtorch and its BLAS run one thread.
  set_cores_per_device(1);
#if TESSERA_BENCH_TORCH
  _mm_setcsr(_mm_getcsr() | 0x8040);  // flush-to-zero: libtorch's best setting here (as gpt_bench)
  torch::set_num_threads(1);
  openblas_set_num_threads(1);
#endif
  std::optional<SdpaKernel> forced_attention;  // in scope while the steps are traced
  if (!attention_backend.empty()) {
    forced_attention.emplace(std::vector<SdpBackend>{attention_backend == "flash" ? SdpBackend::Flash : SdpBackend::Math});
    fmt::print("Tessera's attention: the {} backend only\n", attention_backend);
  }
  const TokenBatch batch(s);
  bool agreed = true;
  for (int64_t layers : s.layers) agreed = compare(s, layers, batch) && agreed;
  set_cores_per_device(0);
  return agreed ? 0 : 1;
}
