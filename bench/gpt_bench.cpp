// The GPT of samples/gpt in Tessera next to the same model in libtorch 1.13, in one process:
// the same initial weights (copied from Tessera's), the same fortunes batches, AdamW (betas 0.9,
// 0.95, weight decay 0.1), gradient clipping at 1 and the warmup + cosine schedule. Prints the
// validation loss of both after N steps, their step times on 1 core, Tessera's on 2 devices, and
// the cold and warm-start compile time of the training step.
// Usage: gpt_bench [--steps N] [--batch-size B] [--layers L] [--width C] [--heads H] [--context T]
//        (the warm-start probe re-runs this binary with --compile-probe DIR)
//        gpt_bench --compile-depths 2,4,8,16 [--width C ...]: the cold first step (initialisers,
//        compile, one step) on dp=2 at each depth, each in a fresh process with an empty cache
//        (the probe re-runs this binary with --first-step-probe DIR).
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <fmt/core.h>
#include <xmmintrin.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"
#include "backend/cpu/orc_engine.hpp"

#include "bench_util.hpp"
#include "torch_peer.hpp"

#if TESSERA_BENCH_TORCH
#include <ATen/autocast_mode.h>
#endif

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

struct Setup {
  std::string data = "/usr/share/games/fortunes";
  int64_t steps = 100, batch_size = 16, layers = 4, width = 128, heads = 4, context = 128, eval_batches = 8, warmup = 20;
  double lr = 1e-3, min_lr = 1e-4;
  uint64_t seed = 1;
};

GptConfig config_of(const Setup& s, int64_t vocab, std::optional<MixedPrecisionPolicy> precision = {}) {
  GptConfig c;
  c.vocab = vocab, c.context = s.context, c.layers = s.layers, c.width = s.width, c.heads = s.heads, c.seed = s.seed;
  c.mixed_precision = precision;
  return c;
}


// Window starts of each training step and of the validation batches: both frameworks see these.
struct FortuneBatches {
  std::vector<std::vector<int64_t>> train, validation;
  FortuneBatches(const TextCorpus& corpus, const Setup& s) {
    for (int64_t step = 0; step < s.steps; ++step) {
      std::mt19937_64 rng(s.seed * 1000003 + uint64_t(step));
      train.push_back(random_window_starts(corpus.train_tokens(), s.batch_size, s.context, rng));
    }
    std::mt19937_64 rng(s.seed * 7919 + 1);
    for (int64_t b = 0; b < s.eval_batches; ++b)
      validation.push_back(random_window_starts(corpus.validation_tokens(), s.batch_size, s.context, rng));
  }
};

double lr_at(const Setup& s, int64_t step) { return warmup_cosine_lr(step, s.warmup, s.steps, s.lr, s.min_lr); }

// How a model is split over its devices: the batch over "dp", or Megatron's plan over "tp"
// (with its sequence parallelism or without).
enum class Split { Data, Tensor, TensorSequence };

// Tessera's model, optimizer and compiled steps on a 1-D mesh, split as asked.
struct TesseraGpt {
  Setup setup;
  Split split;
  Mesh mesh;
  Gpt model;
  std::vector<Variable> params;
  AdamW optimizer;
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  JitFunction<Step> train_step, eval_step;

  TesseraGpt(const Setup& s, int64_t vocab, int devices, Split how = Split::Data, std::optional<MixedPrecisionPolicy> precision = {})
      : setup(s),
        split(how),
        mesh(create_mesh({{how == Split::Data ? "dp" : "tp", devices}})),
        model(parallelized(Gpt(config_of(s, vocab, precision), mesh), how, mesh)),
        params(model.parameters()),
        optimizer(params, s.lr, 0.9, 0.95, 1e-8, 0.1),
        train_step(Step([this](const Tensor& ids, const Tensor& targets) {
          Tensor loss = gpt_loss(model(ids), targets);
          std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
          (void)clip_grad_norm(grads, 1.0);
          optimizer.apply(grads);
          return loss;
        })),
        eval_step(Step([this](const Tensor& ids, const Tensor& targets) { return gpt_loss(model(ids), targets); })) {}

  static Gpt parallelized(Gpt model, Split how, const Mesh& mesh) {
    distribute_gpt(model, mesh, how == Split::TensorSequence, /*fsdp=*/false);  // tp plan on a "tp" mesh; the precision
    return model;
  }
  std::pair<Tensor, Tensor> batch(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts) {
    auto [ids, targets] = text_windows(tokens, starts, setup.context);
    const Placement by = split == Split::Data ? Placement{Shard{0}} : Placement{Replicate{}};
    return {distribute_tensor(ids, mesh, {by}), distribute_tensor(targets, mesh, {by})};
  }
  double train(const TextCorpus& corpus, const std::vector<int64_t>& starts, int64_t step) {
    optimizer.set_learning_rate(lr_at(setup, step));
    auto [ids, targets] = batch(corpus.train_tokens(), starts);
    return double(train_step(ids, targets).full_tensor().data<float>()[0]);
  }
  double validation_loss(const TextCorpus& corpus, const FortuneBatches& batches) {
    double total = 0;
    for (const auto& starts : batches.validation) {
      auto [ids, targets] = batch(corpus.validation_tokens(), starts);
      total += double(eval_step(ids, targets).full_tensor().data<float>()[0]);
    }
    return total / double(batches.validation.size());
  }
};

// Median step time of `model` over `steps` steps after two (the first compiles).
double step_seconds(TesseraGpt& model, const TextCorpus& corpus, const FortuneBatches& batches, int64_t steps) {
  std::vector<double> times;
  for (int64_t step = 0; step < steps; ++step) {
    const auto start = Clock::now();
    model.train(corpus, batches.train[size_t(step)], step);
    if (step >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0 : times[times.size() / 2];
}

int compile_probe(const Setup& s, const std::string& dir) {
  setenv("TESSERA_CACHE_DIR", dir.c_str(), 1);
  const TextCorpus corpus = TextCorpus::from_path(s.data);
  TesseraGpt model(s, corpus.vocab_size(), 1);
  const FortuneBatches batches(corpus, s);
  auto [ids, targets] = model.batch(corpus.train_tokens(), batches.train[0]);
  const auto start = Clock::now();
  model.train_step.executable(ids, targets);  // trace + partition + compile (or load), nothing runs
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("%.2f %lld %lld\n", ms, (long long)compile_stats().compiled_modules, (long long)compile_stats().disk_hits);
  return 0;
}

// A cold process's first training step on dp=2, from building the model (its initialisers
// compile too) to the step's loss; prints milliseconds, modules compiled and disk cache hits.
int first_step_probe(const Setup& s, const std::string& dir) {
  setenv("TESSERA_CACHE_DIR", dir.c_str(), 1);
  const TextCorpus corpus = TextCorpus::from_path(s.data);
  const FortuneBatches batches(corpus, s);
  const auto start = Clock::now();
  TesseraGpt model(s, corpus.vocab_size(), 2);
  (void)model.train(corpus, batches.train[0], 0);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("%.2f %lld %lld\n", ms, (long long)compile_stats().compiled_modules, (long long)compile_stats().disk_hits);
  return 0;
}

// Runs `self` with `flags` and a fresh compile-cache directory; what its probe printed.
std::optional<bench::ProbeResult> probe_in_fresh_cache(const char* self, const std::string& flags) {
  static int serial = 0;
  const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("tessera-depth-cache-{}-{}", getpid(), serial++)).string();
  std::filesystem::remove_all(dir);
  bench::ProbeResult r;
  FILE* pipe = popen(fmt::format("{} {} {}", self, flags, dir).c_str(), "r");
  const bool ok = pipe && fscanf(pipe, "%lf %lld %lld", &r.ms, &r.compiled, &r.disk_hits) == 3;
  if (pipe) pclose(pipe);
  std::filesystem::remove_all(dir);
  if (!ok) return std::nullopt;
  return r;
}

// At each depth, in fresh processes with empty caches: the first step (initialisers, compile,
// one step on dp=2) and the training step's compile alone (trace, partition, kernels; one
// device). Compile time must follow the distinct blocks (one), not the layers.
int compile_depths(const char* self, Setup s, const std::vector<int64_t>& depths) {
  fmt::print("cold starts, width {}, {} heads, context {}, batch {}\n", s.width, s.heads, s.context, s.batch_size);
  fmt::print("{:>7} {:>22} {:>10} {:>24}\n", "layers", "first step (dp=2)", "modules", "training step compile");
  std::map<int64_t, std::pair<double, double>> ms;
  for (int64_t layers : depths) {
    const std::string shape = fmt::format("--steps 1 --batch-size {} --layers {} --width {} --heads {} --context {}", s.batch_size,
                                          layers, s.width, s.heads, s.context);
    const auto first = probe_in_fresh_cache(self, shape + " --first-step-probe");
    const auto compile = probe_in_fresh_cache(self, shape + " --compile-probe");
    if (!first || !compile) {
      fmt::print("{:>7} layers: the probe failed\n", layers);
      return 1;
    }
    ms[layers] = {first->ms, compile->ms};
    fmt::print("{:>7} {:>19.0f} ms {:>10} {:>21.0f} ms\n", layers, first->ms, first->compiled, compile->ms);
  }
  if (ms.count(4))
    for (const auto& [layers, t] : ms)
      fmt::print("{:>3} layers / 4 layers: first step {:.2f}x, training step compile {:.2f}x\n", layers, t.first / ms[4].first,
                 t.second / ms[4].second);
  return 0;
}

#if TESSERA_BENCH_TORCH
// The same GPT in libtorch, written as nanoGPT wrote it for PyTorch 1.13 (explicit causal mask;
// scaled_dot_product_attention came in 2.0). Weights are [in, out] like Tessera's Dense.
struct TorchGpt {
  Setup setup;
  GptConfig config;
  bench::TorchParameters p;
  torch::Tensor causal_mask;

  TorchGpt(const Setup& s, const GptConfig& c, const Gpt& initial) : setup(s), config(c), p(initial) {
    causal_mask = torch::ones({c.context, c.context}, torch::kBool).triu(1);
  }
  torch::Tensor linear(const torch::Tensor& x, const std::string& name) {
    return torch::matmul(x, p[name + ".weight"]) + p[name + ".bias"];
  }
  torch::Tensor norm(const torch::Tensor& x, const std::string& name) {
    return torch::layer_norm(x, {config.width}, p[name + ".weight"], p[name + ".bias"], 1e-5);
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    const int64_t b = ids.size(0), t = ids.size(1), c = config.width, h = config.heads, d = c / h;
    torch::Tensor x = p["tok_embeddings.weight"].index_select(0, ids.view({-1})).view({b, t, c}) + p["pos_embeddings.weight"].slice(0, 0, t);
    for (int64_t l = 0; l < config.layers; ++l) {
      const std::string block = "layers." + std::to_string(l) + ".";
      torch::Tensor y = norm(x, block + "attention_norm");
      auto heads = [&](const torch::Tensor& z) { return z.view({b, t, h, d}).transpose(1, 2); };
      torch::Tensor q = heads(linear(y, block + "attention.wq")), k = heads(linear(y, block + "attention.wk")), v = heads(linear(y, block + "attention.wv"));
      torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
      scores = scores.masked_fill(causal_mask.slice(0, 0, t).slice(1, 0, t), -std::numeric_limits<float>::infinity());
      torch::Tensor attended = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).contiguous().view({b, t, c});
      x = x + linear(attended, block + "attention.wo");
      x = x + linear(torch::gelu(linear(norm(x, block + "ffn_norm"), block + "feed_forward.w1"), "tanh"), block + "feed_forward.w2");
    }
    return linear(norm(x, "norm"), "output");
  }
  torch::Tensor loss(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts) {
    auto [ids, targets] = text_windows(tokens, starts, setup.context);
    torch::Tensor logits = forward(bench::torch_indices(ids));
    return torch::nn::functional::cross_entropy(logits.view({-1, config.vocab}), bench::torch_indices(targets).view({-1}));
  }
};

// Trains `peer` (median step seconds), then its validation loss; `bf16`: under CPU autocast to
// bf16 (PyTorch's mixed precision on the CPU: matmuls in bf16, f32 weights and optimizer).
std::pair<double, double> train_torch(TorchGpt& peer, const TextCorpus& corpus, const FortuneBatches& batches, bool bf16) {
  const Setup& s = peer.setup;
  torch::optim::AdamW optimizer(peer.p.ordered, torch::optim::AdamWOptions(s.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  auto autocast = [bf16](bool on) {
    if (!bf16) return;
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(on);
    if (!on) at::autocast::clear_cache();
  };
  std::vector<double> times;
  for (int64_t step = 0; step < s.steps; ++step) {
    const auto start = Clock::now();
    for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr_at(s, step));
    optimizer.zero_grad();
    autocast(true);
    torch::Tensor loss = peer.loss(corpus.train_tokens(), batches.train[size_t(step)]);
    autocast(false);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(peer.p.ordered, 1.0);
    optimizer.step();
    (void)loss.item<float>();
    if (step >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  double validation = 0;
  {
    torch::NoGradGuard no_grad;
    autocast(true);
    for (const auto& starts : batches.validation) validation += peer.loss(corpus.validation_tokens(), starts).item<double>();
    autocast(false);
    validation /= double(batches.validation.size());
  }
  return {times.empty() ? 0 : times[times.size() / 2], validation};
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  std::string probe_dir;
  CLI::App app{"GPT training: Tessera and libtorch on the same model, data and optimizer"};
  app.add_option("--steps", s.steps);
  app.add_option("--batch-size", s.batch_size);
  app.add_option("--layers", s.layers);
  app.add_option("--width", s.width);
  app.add_option("--heads", s.heads);
  app.add_option("--context", s.context);
  app.add_option("--compile-probe", probe_dir);
  std::string first_step_dir;
  app.add_option("--first-step-probe", first_step_dir);
  std::vector<int64_t> depths;
  app.add_option("--compile-depths", depths, "cold first steps at these depths, e.g. 2,4,8,16")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  s.warmup = std::min(s.warmup, s.steps);
  if (!probe_dir.empty()) return compile_probe(s, probe_dir);
  if (!first_step_dir.empty()) return first_step_probe(s, first_step_dir);
  if (!depths.empty()) return compile_depths(argv[0], s, depths);

  const TextCorpus corpus = TextCorpus::from_path(s.data);
  const FortuneBatches batches(corpus, s);
  fmt::print("GPT {} layers, width {}, {} heads, context {}, batch {}, vocabulary {}; {} AdamW steps on fortunes\n", s.layers, s.width,
             s.heads, s.context, s.batch_size, corpus.vocab_size(), s.steps);

  // Tessera on one device with one core: the loss after N steps and the step time.
  set_cores_per_device(1);
  TesseraGpt one(s, corpus.vocab_size(), 1);
#if TESSERA_BENCH_TORCH
  _mm_setcsr(_mm_getcsr() | 0x8040);  // flush-to-zero: libtorch's best setting here
  torch::set_num_threads(1);
  openblas_set_num_threads(1);
  TorchGpt peer(s, config_of(s, corpus.vocab_size()), one.model);  // before Tessera trains: the same start
  TorchGpt peer_bf16(s, config_of(s, corpus.vocab_size()), one.model);
#endif
  const double tessera_step = step_seconds(one, corpus, batches, s.steps);
  const double tessera_loss = one.validation_loss(corpus, batches);
  fmt::print("{:<40} step {:8.2f} ms   validation loss {:.4f}\n", "Tessera, 1 device (1 core)", tessera_step * 1e3, tessera_loss);
  {
    // The same model with each attention backend forced (the default takes the fused flash
    // kernel from 256 keys on): what the kernel buys at this context length.
    double seconds[2] = {};
    for (SdpBackend backend : {SdpBackend::Flash, SdpBackend::Math}) {
      SdpaKernel only({backend});
      TesseraGpt forced(s, corpus.vocab_size(), 1);
      const double step = step_seconds(forced, corpus, batches, s.steps);
      seconds[backend == SdpBackend::Flash ? 0 : 1] = step;
      fmt::print("{:<40} step {:8.2f} ms   validation loss {:.4f}\n",
                 backend == SdpBackend::Flash ? "Tessera, 1 device, flash attention" : "Tessera, 1 device, math attention", step * 1e3,
                 forced.validation_loss(corpus, batches));
    }
    fmt::print("flash attention is {:.2f}x the math backend's speed\n", seconds[1] / seconds[0]);
  }
  // bf16 mixed precision (MixedPrecisionPolicy): the same start, steps and batches.
  TesseraGpt mixed(s, corpus.vocab_size(), 1, Split::Data, kBf16MixedPrecision);
  const double mixed_step = step_seconds(mixed, corpus, batches, s.steps);
  const double mixed_loss = mixed.validation_loss(corpus, batches);
  fmt::print("{:<40} step {:8.2f} ms   validation loss {:.4f}\n", "Tessera, 1 device, bf16 mixed precision", mixed_step * 1e3,
             mixed_loss);
  fmt::print("bf16 is {:.2f}x f32's speed; validation loss {:+.2f}% from f32's\n", tessera_step / mixed_step,
             100.0 * (mixed_loss - tessera_loss) / tessera_loss);

#if TESSERA_BENCH_TORCH
  {
    const auto [torch_step, torch_loss] = train_torch(peer, corpus, batches, false);
    fmt::print("{:<40} step {:8.2f} ms   validation loss {:.4f}\n", "libtorch 1.13, 1 thread, flush-to-zero", torch_step * 1e3,
               torch_loss);
    fmt::print("Tessera is {:.2f}x faster per step; validation loss {:+.2f}% from libtorch's\n", torch_step / tessera_step,
               100.0 * (tessera_loss - torch_loss) / torch_loss);
    const auto [bf16_step, bf16_loss] = train_torch(peer_bf16, corpus, batches, true);
    fmt::print("{:<40} step {:8.2f} ms   validation loss {:.4f}\n", "libtorch 1.13, bf16 autocast", bf16_step * 1e3, bf16_loss);
    fmt::print("Tessera bf16 is {:.2f}x faster per step than libtorch's bf16 autocast\n", bf16_step / mixed_step);
  }
#else
  fmt::print("libtorch: not built (install libtorch-dev and reconfigure)\n");
#endif

  // Two devices (one core each): data parallel (the batch split in two), then tensor parallel
  // without and with sequence parallelism.
  for (const auto& [how, name] : {std::pair{Split::Data, "Tessera, 2 devices (dp=2)"}, std::pair{Split::Tensor, "Tessera, 2 devices (tp=2)"},
                                   std::pair{Split::TensorSequence, "Tessera, 2 devices (tp=2, sequence par.)"}}) {
    TesseraGpt two(s, corpus.vocab_size(), 2, how);
    const double two_step = step_seconds(two, corpus, batches, std::min<int64_t>(s.steps, 30));
    fmt::print("{:<40} step {:8.2f} ms   {:.2f}x the 1-device speed\n", name, two_step * 1e3, tessera_step / two_step);
  }
  set_cores_per_device(0);

  if (auto probes = bench::cold_and_warm(argv[0], fmt::format("--steps {} --batch-size {} --layers {} --width {} --heads {} --context {} --compile-probe",
                                                              s.steps, s.batch_size, s.layers, s.width, s.heads, s.context))) {
    const auto& [cold, warm] = *probes;
    fmt::print("compile of the training step: cold {:.0f} ms ({} modules compiled), warm start {:.0f} ms ({} from the disk cache)\n",
               cold.ms, cold.compiled, warm.ms, warm.disk_hits);
  }
  return 0;
}
