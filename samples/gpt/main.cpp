// A character-level GPT trained on the text of Debian's fortunes, on any mesh: data parallel
// (--mesh dp=N), Megatron tensor parallel (--mesh tp=N), sequence (context) parallel (--mesh sp=N:
// every sequence split into N runs of positions), any combination (--mesh dp=2,tp=2,sp=2), with
// Megatron's sequence parallelism on tp (--sequence-parallel: layer norms and the residual stream
// on sequence shards), with the parameters fully sharded over dp (--fsdp), pipelined over stages
// of blocks (--mesh pp=N, with dp, tp, sp, --fsdp and bf16 too: --mesh pp=2,dp=2; --microbatches;
// --schedule gpipe, 1f1b, looped-bfs or interleaved-1f1b),
// in one process on virtual devices or under mpirun
// with one device per process. The loss curve is the same on every mesh (bitwise under
// TESSERA_DETERMINISTIC=1). Prints a progress bar, tokens/s, train and validation loss per
// interval; writes metrics.csv and a plot; saves and resumes checkpoints; ends with a summary line
// (median step time over the steps after the first two, tokens/s, final validation loss; the line
// bench/gpt_gpu_peers.py prints for PyTorch) and generated text.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>
#include <tuple>

#include <tessera/tessera.hpp>

#include "../common/gnuplot.hpp"
#include "../common/mesh_option.hpp"
#include "../common/output_file.hpp"
#include "../common/progress_line.hpp"
#include "../common/report_errors.hpp"

namespace {

using namespace tessera;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string data = "/usr/share/games/fortunes";
  std::string mesh;  // default: dp over every core (one process) or every client (mpirun)
  std::string device = "cpu";
  bool fsdp = false;
  bool sequence_parallel = false;
  std::string activation_checkpointing = "none";
  std::string precision = "f32";
  int64_t microbatches = 1, virtual_stages = 0;  // 0: the schedule's (1 for gpipe, 2 for looped-bfs)
  std::string schedule = "gpipe";
  // gpt (GPT-2's layout), llama (RMSNorm, RoPE, grouped-query attention, SwiGLU), or moe (llama
  // with mixture-of-experts layers after the first)
  std::string model = "gpt";
  int64_t experts = 4, experts_per_token = 2;
  double capacity_factor = 0;  // --model moe: 0 dropless
  int64_t layers = 4, width = 128, heads = 4, kv_heads = 0, context = 128, batch_size = 32, steps = 2000;  // kv_heads 0: the model's default
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, clip = 1.0, validation_fraction = 0.1;
  int64_t warmup = 100, eval_interval = 100, eval_batches = 8;
  uint64_t seed = 1;
  std::string out = "gpt_out", checkpoint;
  bool resume = false;
  int64_t stop_at = -1;  // end this run after this step; the schedule still spans `steps`
  int64_t generate = 300;
  std::string prompt = "\n";
  double temperature = 0.8, expect_val_loss = -1;
  int64_t top_k = 0;   // 0: every character
  double top_p = 1.0;  // 1: the whole distribution (nucleus sampling below 1)
};

void say(const std::string& text) {
  if (client_id() == 0) {
    fmt::print("{}", text);
    std::fflush(stdout);
  }
}

// --model llama and moe: Llama's layout at the sample's size, with the GPT config's seed and training
// options; its SwiGLU hidden size by Meta's rule (multiple of 32 at these widths).
TransformerConfig llama_config(const Options& o, int64_t vocab, const GptConfig& gpt) {
  TransformerConfig c;
  c.name = "llama";
  c.vocab = vocab, c.dim = o.width, c.layers = o.layers, c.heads = o.heads, c.max_seq = o.context;
  c.kv_heads = o.kv_heads > 0 ? o.kv_heads : (o.heads % 2 == 0 ? o.heads / 2 : o.heads);
  c.hidden = swiglu_hidden_size(o.width, 32);
  c.seed = gpt.seed, c.activation_checkpointing = gpt.activation_checkpointing, c.mixed_precision = gpt.mixed_precision;
  if (o.model == "moe") {
    // One shared expert and half-width routed ones (each token: about the dense MLP's work for top-2).
    c.name = "moe";
    c.moe = MoEConfig{.num_experts = o.experts, .top_k = o.experts_per_token, .num_shared_experts = 1, .expert_hidden = c.hidden / 2,
                      .first_dense_layers = 1, .capacity_factor = o.capacity_factor};
  }
  return c;
}

Mesh make_mesh(Options& o) {
  if (o.mesh.empty())
    o.mesh = "dp=" + std::to_string(multi_client() ? num_clients() : std::max(1u, std::thread::hardware_concurrency()));
  const samples::MeshDims dims = samples::parse_mesh_option(o.mesh, {"pp", "dp", "ep", "cp", "tp", "sp"});
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  for (const auto& [name, size] : dims) names.push_back(name), shape.push_back(size);
  return init_device_mesh(o.device, shape, names);
}

// Batches [B, T] are split as the library's training step splits them
// (TransformerTrainingStep::batch_layout): over dp (and ep, which borrows data-parallel ranks for
// the experts) by sequence and over sp and cp by position, whole on tp. Under sp every token-wise
// layer runs on its run of positions; attention reads the keys and values of all of them (the
// partitioner gathers them over sp) and the weight gradients are summed over sp. Under cp the
// same, except that attention is ring attention: no device ever holds all keys and values.
std::vector<Placement> batch_placements(const Mesh& mesh) { return TransformerTrainingStep::batch_layout(mesh).placements(); }

double scalar(const Tensor& t) { return double(t.full_tensor().data<float>()[0]); }

samples::ProgressLine progress_line;

void progress(int64_t step, int64_t total, double loss, double lr, double tokens_per_s) {
  say(progress_line.update(step, total, fmt::format("step {}/{}", step, total),
                           fmt::format("loss {:.4f} lr {:.2e} {:.0f} tokens/s", loss, lr, tokens_per_s)));
}

// Samples `count` characters after `prompt`: each step runs the model on the last `context`
// tokens, padded on the right to the full context (causal attention makes the padding
// invisible to the positions before it), so one compiled forward serves every step.
// One character after `ids`' position `position`, drawn on the mesh: softmax at the temperature,
// sorted descending; the top-k characters and the smallest set whose probability reaches top-p
// kept; then the first kept character whose running sum passes u (a host draw in [0, 1)) times
// the kept mass, mapped back through the sort.
Tensor sample_next(Module& model, const Tensor& ids, const Tensor& position, const Tensor& u, const Options& o) {
  const Tensor logits = index_select(model(ids), 1, position);  // [1, 1, vocab]
  const int64_t vocab = logits.shape().back();
  const Tensor probs = softmax(reshape(logits, {vocab}) / o.temperature, 0);
  auto [sorted, order] = sort(probs, 0, true);
  const Tensor rank = iota({vocab}, 0, Layout::replicated(sorted.device_mesh(), 1), DType::f32);
  const Tensor mass_before = cumsum(sorted, 0) - sorted;
  Tensor kept = where(mass_before < o.top_p, sorted, 0.0);
  if (o.top_k > 0) kept = where(rank < double(o.top_k), kept, 0.0);
  const Tensor running = cumsum(kept, 0);
  const Tensor total = slice(running, {vocab - 1}, {1});
  const Tensor at = minimum(reduce_sum(cast(running <= u * total, DType::i64), {0}, true), int64_t(vocab - 1));
  return take_along_axis(order, at, 0);
}

std::string generate(Module& model, const Mesh& mesh, const TextCorpus& corpus, const Options& o) {
  auto next = jit([&](const Tensor& ids, const Tensor& position, const Tensor& u) { return sample_next(model, ids, position, u, o); });
  std::vector<int32_t> tokens = corpus.encode(o.prompt);
  if (tokens.empty()) tokens.push_back(0);
  std::mt19937_64 rng(o.seed + 17);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const std::vector<Placement> replicated(size_t(mesh.ndim()), Replicate{});
  for (int64_t i = 0; i < o.generate; ++i) {
    const int64_t first = std::max<int64_t>(0, int64_t(tokens.size()) - o.context);
    const int64_t used = int64_t(tokens.size()) - first;
    Array window({1, o.context}, DType::i32);
    std::fill_n(window.mutable_data<int32_t>(), o.context, 0);
    std::copy(tokens.begin() + first, tokens.end(), window.mutable_data<int32_t>());
    // Every client draws the same u (the same seed), so all sample the same character.
    const Tensor token = next(distribute_tensor(window, mesh, replicated),
                              distribute_tensor(Array::from<int64_t>({used - 1}, {1}), mesh, replicated),
                              distribute_tensor(Array::from<float>({float(uniform(rng))}, {1}), mesh, replicated));
    tokens.push_back(int32_t(token.full_tensor().to_vector<int64_t>()[0]));
  }
  return corpus.decode(tokens);
}

// Each flag on its own, the message naming it and its value: a NaN learning rate trained on NaN
// losses and exited 0, and --microbatches -3 without pp was silently ignored.
void check_options(const Options& o) {
  auto require = [](bool ok, const char* flag, const auto& value, const char* rule) {
    if (!ok) throw Error(fmt::format("{} {}: {}", flag, value, rule));
  };
  auto finite = [](double v) { return std::isfinite(v); };
  require(o.layers >= 1, "--layers", o.layers, "the model needs at least 1 block");
  require(o.width >= 1, "--width", o.width, "the width must be at least 1");
  require(o.heads >= 1, "--heads", o.heads, "the model needs at least 1 attention head");
  require(o.kv_heads >= 0, "--kv-heads", o.kv_heads, "must be at least 0 (0: the model's default)");
  require(o.kv_heads == 0 || o.model != "gpt", "--kv-heads", o.kv_heads, "grouped-query attention is --model llama's and moe's");
  require(o.experts >= 1, "--experts", o.experts, "a mixture needs at least 1 expert");
  require(o.experts_per_token >= 1 && o.experts_per_token <= o.experts, "--experts-per-token", o.experts_per_token, "must be between 1 and --experts");
  require(o.capacity_factor >= 0 && std::isfinite(o.capacity_factor), "--capacity-factor", o.capacity_factor,
          "must be 0 (dropless) or positive");
  require(o.context >= 1, "--context", o.context, "a sequence needs at least 1 token");
  require(o.batch_size >= 1, "--batch-size", o.batch_size, "a step needs at least 1 sequence");
  require(o.steps >= 0, "--steps", o.steps, "must be at least 0");
  require(o.microbatches >= 1, "--microbatches", o.microbatches, "a step needs at least 1 microbatch");
  require(o.virtual_stages >= 0, "--virtual-stages", o.virtual_stages, "must be at least 0 (0: the schedule's)");
  require(finite(o.lr) && o.lr > 0, "--lr", o.lr, "the learning rate must be finite and positive");
  require(finite(o.min_lr) && o.min_lr >= 0, "--min-lr", o.min_lr, "the final learning rate must be finite and at least 0");
  require(o.warmup >= 0, "--warmup", o.warmup, "must be at least 0 steps");
  require(finite(o.weight_decay) && o.weight_decay >= 0, "--weight-decay", o.weight_decay, "must be finite and at least 0");
  require(finite(o.clip) && o.clip > 0, "--clip", o.clip, "the gradient norm limit must be finite and positive");
  require(o.eval_interval >= 1, "--eval-interval", o.eval_interval, "must be at least 1 step");
  // The validation loss is taken at step 0 and every interval: over no batch it was 0 / 0.
  require(o.eval_batches >= 1, "--eval-batches", o.eval_batches, "each validation loss needs at least 1 batch");
  require(finite(o.temperature) && o.temperature > 0, "--temperature", o.temperature, "must be finite and positive");
  require(o.top_k >= 0, "--top-k", o.top_k, "must be at least 0 (0: every character)");
  require(o.top_p > 0 && o.top_p <= 1, "--top-p", o.top_p, "must be in (0, 1]");
}

int run(int argc, char** argv) {
  init(argc, argv);
  Options o;
  CLI::App app{"A character-level GPT on Debian's fortunes, trained with Tessera on any mesh"};
  app.add_option("--data", o.data, "a text file, or a directory of them (plain files only)");
  app.add_option("--mesh", o.mesh, "mesh dims pp, dp, ep (--model moe), cp (ring attention), tp and sp, e.g. dp=2, tp=2, dp=2,tp=2, dp=2,tp=2,sp=2, pp=2,dp=2, cp=2,tp=2 or dp=2,ep=2 (default: dp over every core, or every mpirun client)");
  app.add_option("--microbatches", o.microbatches, "microbatches per step: the pipeline's on a pp mesh, gradient accumulation on any other "
                 "(the same losses on every mesh with the same count)");
  app.add_option("--schedule", o.schedule, "pipeline schedule (torch.distributed.pipelining's names): gpipe; 1f1b (each device "
                 "alternates forwards and backwards, recomputing its stage: less memory); looped-bfs (virtual stages: the "
                 "microbatches go round the devices once per virtual stage, a smaller bubble); interleaved-1f1b (both)");
  app.add_option("--virtual-stages", o.virtual_stages, "model chunks per device for looped-bfs and interleaved-1f1b (default 2)");
  app.add_option("--device", o.device, "the mesh's device type")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_flag("--fsdp", o.fsdp, "shard parameters, gradients and optimizer state over dp (ZeRO-3)");
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "Megatron sequence parallelism on tp: layer norms and the residual stream on sequence shards");
  app.add_option("--activation-checkpointing", o.activation_checkpointing,
                 "recompute each block's activations in the backward: every op (full), or all but its GEMMs (selective)")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  app.add_option("--precision", o.precision, "f32, or bf16: parameters gathered and used in bf16 with f32 master weights, "
                 "gradients reduced in f32 (MixedPrecisionPolicy)")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--model", o.model, "gpt: GPT-2's layout (LayerNorm, learned positions, GELU); llama: Llama's (RMSNorm, rotary "
                 "embeddings, grouped-query attention, SwiGLU); moe: llama with dropless mixture-of-experts layers after the first (experts "
                 "over ep: --mesh dp=2,ep=2)")->check(CLI::IsMember({"gpt", "llama", "moe"}));
  app.add_option("--experts", o.experts, "--model moe: routed experts per MoE layer (ep must divide them)");
  app.add_option("--experts-per-token", o.experts_per_token, "--model moe: experts each token is routed to (top-k)");
  app.add_option("--capacity-factor", o.capacity_factor, "--model moe: 0 (default) runs dropless; C > 0 lets each expert run at most "
                 "C x tokens x top-k / experts assignments a step and drops the rest (GShard's capacity factor)");
  app.add_option("--layers", o.layers)->take_last();
  app.add_option("--width", o.width, "model width (embedding size)");
  app.add_option("--heads", o.heads, "attention heads (a divisor of the width)");
  app.add_option("--kv-heads", o.kv_heads, "--model llama: key/value heads, a divisor of --heads (default: half the heads where even)");
  app.add_option("--context", o.context, "tokens per sequence");
  app.add_option("--batch-size", o.batch_size, "sequences per step (global)");
  app.add_option("--steps", o.steps, "training steps");
  app.add_option("--lr", o.lr, "peak AdamW learning rate");
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine decay");
  app.add_option("--warmup", o.warmup, "linear warmup steps");
  app.add_option("--weight-decay", o.weight_decay);
  app.add_option("--clip", o.clip, "gradient norm clipping");
  app.add_option("--validation-fraction", o.validation_fraction, "share of the text held out");
  app.add_option("--eval-interval", o.eval_interval, "steps between validation losses (and checkpoints)");
  app.add_option("--eval-batches", o.eval_batches, "batches in each validation loss");
  app.add_option("--seed", o.seed, "initialisation and sampling seed");
  app.add_option("--out", o.out, "directory for metrics.csv and the plot");
  app.add_option("--checkpoint", o.checkpoint, "save model and optimizer here every interval and at the end");
  app.add_flag("--resume", o.resume, "continue from --checkpoint");
  app.add_option("--stop-at", o.stop_at, "end this run after this step (the schedule still spans --steps; go on with --resume)");
  app.add_option("--generate", o.generate, "characters to generate at the end");
  app.add_option("--prompt", o.prompt, "text to generate from");
  app.add_option("--temperature", o.temperature);
  app.add_option("--top-k", o.top_k, "sample from the k most likely characters (0: all)");
  app.add_option("--top-p", o.top_p, "sample from the smallest set of characters whose probability reaches p (1: all)");
  app.add_option("--expect-val-loss", o.expect_val_loss, "fail unless validation loss falls and ends at or below this");
  CLI11_PARSE(app, argc, argv);
  if (o.resume && o.checkpoint.empty()) throw Error("--resume needs --checkpoint");
  check_options(o);

  // Meshes made without a device list take this type (dsl/mesh.hpp).
  setenv("TESSERA_DEVICE_TYPE", o.device == "gpu" ? "GPU" : "CPU", 1);
  const Mesh mesh = make_mesh(o);
  const TextCorpus corpus = TextCorpus::from_path(o.data, o.validation_fraction);
  GptConfig config;
  config.vocab = corpus.vocab_size();
  config.context = o.context, config.layers = o.layers, config.width = o.width, config.heads = o.heads, config.seed = o.seed;
  if (o.activation_checkpointing != "none")
    config.activation_checkpointing = o.activation_checkpointing == "full" ? CheckpointPolicy::Full : CheckpointPolicy::Selective;
  if (o.precision == "bf16") config.mixed_precision = kBf16MixedPrecision;
  // Stages of blocks on pp, or microbatches anywhere: the pipelined GPT (one stage without pp).
  const bool pipelined = mesh.contains_dim("pp") || o.microbatches > 1;
  const PipelineSchedule schedule = parse_pipeline_schedule(o.schedule);
  if (o.virtual_stages == 0) o.virtual_stages = pipeline_schedule_loops(schedule) ? 2 : 1;
  if (pipeline_schedule_loops(schedule) != (o.virtual_stages > 1))
    throw Error("--schedule gpipe and 1f1b run one stage per device, looped-bfs and interleaved-1f1b several: --virtual-stages " +
                std::to_string(o.virtual_stages) + " does not fit --schedule " + o.schedule);
  std::unique_ptr<Module> owned;
  PipelinedTransformer* pipeline = nullptr;
  Transformer* transformer = nullptr;  // --model llama and moe, unpipelined
  if (pipelined) {
    // --model llama and moe in stages too.
    std::unique_ptr<PipelinedTransformer> p;
    if (o.model == "gpt") p = std::make_unique<PipelinedGpt>(config, mesh, o.virtual_stages);
    else p = std::make_unique<PipelinedTransformer>(llama_config(o, corpus.vocab_size(), config), mesh, o.virtual_stages);
    distribute_pipelined_transformer(*p, mesh, o.fsdp, o.sequence_parallel);
    pipeline = p.get();
    owned = std::move(p);
  } else if (o.model != "gpt") {
    auto llama = std::make_unique<Transformer>(llama_config(o, corpus.vocab_size(), config), mesh);
    transformer = llama.get();
    distribute_transformer(*llama, mesh, o.sequence_parallel, o.fsdp);
    owned = std::move(llama);
  } else {
    auto plain = std::make_unique<Gpt>(config, mesh);
    distribute_gpt(*plain, mesh, o.sequence_parallel, o.fsdp);
    owned = std::move(plain);
  }
  Module& model = *owned;
  const std::vector<Variable> params = model.parameters();
  int64_t parameter_count = 0;
  for (const Variable& p : params) {
    int64_t n = 1;
    for (int64_t extent : p.shape()) n *= extent;
    parameter_count += n;
  }
  say(fmt::format("{}: {} characters ({} train / {} validation), vocabulary {}\n", o.data, corpus.size(), corpus.train_tokens().size(),
                  corpus.validation_tokens().size(), corpus.vocab_size()));
  if (pipeline)
    say(fmt::format("pipeline: {} stage(s) x {} virtual, chunks of {} block(s), {} microbatches, schedule {} (bubble {:.1f}%)\n",
                    pipeline->stages(), pipeline->virtual_stages(), fmt::join(pipeline->chunk_blocks(), "/"), o.microbatches, o.schedule,
                    100 * PipelineTimetable(pipeline->stages(), pipeline->virtual_stages(), o.microbatches).bubble_fraction()));
  say(fmt::format("{}: {} layers, width {}, {} heads, context {}: {} parameters; mesh {}{}; batch {}\n",
                  o.model == "gpt" ? "GPT" : o.model == "llama" ? "Llama" : "MoE", o.layers, o.width, o.heads,
                  o.context, parameter_count, o.mesh, std::string(o.sequence_parallel ? " (sequence parallel on tp)" : "") + (o.fsdp ? " (fully sharded over dp)" : "") +
                      (o.activation_checkpointing != "none" ? " (" + o.activation_checkpointing + " activation checkpointing)" : "") +
                      (o.precision != "f32" ? " (" + o.precision + " mixed precision)" : ""), o.batch_size));

  AdamW optimizer(params, o.lr, 0.9, 0.95, 1e-8, o.weight_decay);
  // The checkpoint holds the model and the optimizer (whose step count is the training step).
  std::map<std::string, Variable> state = model.state_dict();
  const auto named = model.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    state.emplace("adamw.m." + named[i].first, optimizer.first_moments()[i]);
    state.emplace("adamw.v." + named[i].first, optimizer.second_moments()[i]);
  }
  state.emplace("adamw.step", optimizer.step());
  int64_t start_step = 0;
  if (o.resume) {
    load(o.checkpoint, state);
    start_step = int64_t(std::llround(to_array(optimizer.step().value()).to_vector<double>()[0]));
    say(fmt::format("resumed from {} at step {}\n", o.checkpoint, start_step));
  }

  auto train_step = jit([&](const Tensor& ids, const Tensor& targets) {
    Tensor loss;
    std::vector<Tensor> grads;
    if (pipeline) {
      std::tie(loss, grads) = pipeline->loss_and_gradients(ids, targets, o.microbatches, schedule);
      (void)clip_grad_norm(grads, pipeline->gradient_squares(grads), o.clip);
    } else {
      loss = gpt_loss(model(ids), targets);
      // MoE: the experts' load balanced by the config's aux_loss_coefficient (torchtitan's
      // default, 0.01) x the balancing loss; the curve shows the cross entropy alone.
      const bool moe = transformer && !transformer->moe_layers().empty();
      const Tensor objective = moe ? loss + transformer->config().moe->aux_loss_coefficient * transformer->moe_aux_loss() : loss;
      grads = gradients(objective, std::vector<Tensor>(params.begin(), params.end()));
      (void)clip_grad_norm(grads, o.clip);
    }
    optimizer.apply(grads);
    return loss;
  });
  auto eval_loss = jit([&](const Tensor& ids, const Tensor& targets) { return gpt_loss(model(ids), targets); });

  const std::vector<Placement> placements = batch_placements(mesh);
  auto batch = [&](const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts) {
    auto [ids, targets] = text_windows(tokens, starts, o.context);
    return std::make_pair(distribute_tensor(ids, mesh, placements), distribute_tensor(targets, mesh, placements));
  };
  // Validation windows are drawn once, so every interval's loss is over the same text.
  std::vector<std::vector<int64_t>> validation_starts;
  {
    std::mt19937_64 rng(o.seed * 7919 + 1);
    for (int64_t b = 0; b < o.eval_batches; ++b)
      validation_starts.push_back(random_window_starts(corpus.validation_tokens(), o.batch_size, o.context, rng));
  }
  auto validation_loss = [&] {
    double total = 0;
    for (const auto& starts : validation_starts) {
      auto [ids, targets] = batch(corpus.validation_tokens(), starts);
      total += scalar(eval_loss(ids, targets));
    }
    return total / double(validation_starts.size());
  };

  const std::string out_dir = client_id() == 0 ? o.out : o.out + "/client" + std::to_string(client_id());
  std::filesystem::create_directories(out_dir);
  // A resumed run appends to its metrics (refusing a link there); a new one makes the file afresh
  // and renames it into place, replacing whatever is at the name rather than writing through it.
  const bool append = o.resume && std::filesystem::symlink_status(out_dir + "/metrics.csv").type() != std::filesystem::file_type::not_found;
  samples::OutputFile metrics =
      append ? samples::OutputFile::appending(out_dir, "metrics.csv") : samples::OutputFile::replacing(out_dir, "metrics.csv");
  metrics.commit();
  if (!append) metrics.write("step,train_loss,validation_loss,learning_rate,tokens_per_second,seconds\n");

  const double first_validation = validation_loss();
  if (start_step == 0) {
    say(fmt::format("step 0: validation loss {:.4f} (uniform guessing: {:.4f})\n", first_validation, std::log(double(corpus.vocab_size()))));
    metrics.write(fmt::format("0,,{:.9g},0,,0\n", first_validation));
  }
  double last_validation = first_validation, interval_loss = 0, train_seconds = 0, first_step_seconds = 0;
  int64_t interval_steps = 0;
  std::vector<double> step_seconds;  // every step of this run, each waited for (its loss read)
  const int64_t tokens_per_step = o.batch_size * o.context;
  auto interval_start = Clock::now();
  const int64_t end_step = o.stop_at >= 0 ? std::min(o.stop_at, o.steps) : o.steps;
  for (int64_t step = start_step; step < end_step; ++step) {
    const double lr = warmup_cosine_lr(step, std::min(o.warmup, o.steps), o.steps, o.lr, o.min_lr);
    optimizer.set_learning_rate(lr);
    // Each step's windows come from the seed and the step alone, so a resumed run sees the same data.
    std::mt19937_64 rng(o.seed * 1000003 + uint64_t(step));
    auto [ids, targets] = batch(corpus.train_tokens(), random_window_starts(corpus.train_tokens(), o.batch_size, o.context, rng));
    const auto step_start = Clock::now();
    const double loss = scalar(train_step(ids, targets));
    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    if (step == start_step) first_step_seconds = seconds;  // tracing and compiling included
    step_seconds.push_back(seconds);
    interval_loss += loss;
    ++interval_steps;
    train_seconds += seconds;
    const double interval_seconds = std::chrono::duration<double>(Clock::now() - interval_start).count();
    progress(step + 1, o.steps, interval_loss / double(interval_steps), lr, double(interval_steps * tokens_per_step) / interval_seconds);
    if ((step + 1) % o.eval_interval == 0 || step + 1 == end_step) {
      const double tokens_per_s = double(interval_steps * tokens_per_step) / interval_seconds;
      last_validation = validation_loss();
      say(progress_line.end_line() + fmt::format("step {}: train loss {:.4f}, validation loss {:.4f}, {:.0f} tokens/s\n", step + 1,
                      interval_loss / double(interval_steps), last_validation, tokens_per_s));
      metrics.write(fmt::format("{},{:.9g},{:.9g},{:.3e},{:.1f},{:.3f}\n", step + 1, interval_loss / double(interval_steps),
                                last_validation, lr, tokens_per_s, train_seconds));
      if (!o.checkpoint.empty()) save(o.checkpoint, state);
      interval_loss = 0, interval_steps = 0;
      interval_start = Clock::now();
    }
  }
  if (end_step > start_step) {
    say(fmt::format("first step {:.2f} s (tracing and compiling included); {:.1f} s training\n", first_step_seconds, train_seconds));
    // The median over the steps after the first two (the first compiles; the second may still
    // settle caches), as bench/gpt_gpu_peers.py reports PyTorch's.
    std::vector<double> later(step_seconds.begin() + std::min<ptrdiff_t>(2, ptrdiff_t(step_seconds.size())), step_seconds.end());
    if (later.empty()) {
      say(fmt::format("summary: {} steps, none after the first two to time; validation loss {:.4f} after step {}\n", step_seconds.size(),
                      last_validation, end_step));
    } else {
      std::sort(later.begin(), later.end());
      const size_t n = later.size();
      const double median = n % 2 ? later[n / 2] : 0.5 * (later[n / 2 - 1] + later[n / 2]);
      say(fmt::format("summary: median step {:.3f} ms over {} steps after the first two, {:.0f} tokens/s, validation loss {:.4f} "
                      "after step {} (mesh {}, device {}, batch {} x context {})\n",
                      median * 1e3, n, double(tokens_per_step) / median, last_validation, end_step, o.mesh, o.device, o.batch_size,
                      o.context));
    }
  }
  if (client_id() == 0)
    samples::plot_metrics(out_dir, "metrics.csv", "step", {{"loss", {{2, "train"}, {3, "validation"}}}, {"tokens/s", {{5, "tokens/s"}}}});
  if (!o.checkpoint.empty()) say(fmt::format("checkpoint: {}\n", o.checkpoint));
  if (o.generate > 0) say(fmt::format("--- generated ---\n{}\n-----------------\n", generate(model, mesh, corpus, o)));
  if (o.expect_val_loss >= 0) {
    say(fmt::format("validation loss {:.4f} -> {:.4f} (expected <= {})\n", first_validation, last_validation, o.expect_val_loss));
    if (!(last_validation < first_validation) || last_validation > o.expect_val_loss) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return samples::report_errors([&] { return run(argc, argv); }); }
