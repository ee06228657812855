#include "nn/gpt.hpp"

#include <string>

#include "dsl/activations.hpp"
#include "dsl/attention.hpp"
#include "dsl/error.hpp"
#include "dsl/ops.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

std::shared_ptr<Dense> dense(int64_t in, int64_t out, const Mesh& mesh, uint64_t seed) {
  return std::make_shared<Dense>(in, out, Layout::replicated(mesh, 2), seed);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GptConfig& c, const Mesh& mesh, uint64_t seed)
    : heads_(checked_gpt_config(c, "CausalSelfAttention").heads),
      q_(register_module("q", dense(c.width, c.width, mesh, seed))),
      k_(register_module("k", dense(c.width, c.width, mesh, seed + 1))),
      v_(register_module("v", dense(c.width, c.width, mesh, seed + 2))),
      proj_(register_module("proj", dense(c.width, c.width, mesh, seed + 3))) {}

std::vector<Tensor> CausalSelfAttention::forward(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  const int64_t b = x.shape()[0], t = x.shape()[1], c = x.shape()[2], d = c / heads_;
  // [B, T, C] -> [B, H, T, D]: whole heads wherever the width is split by whole heads.
  auto split_heads = [&](const Tensor& y) { return transpose(reshape(y, {b, t, heads_, d}), {0, 2, 1, 3}); };
  Tensor attended = scaled_dot_product_attention(split_heads((*q_)(x)), split_heads((*k_)(x)), split_heads((*v_)(x)), true);
  return {(*proj_)(reshape(transpose(attended, {0, 2, 1, 3}), {b, t, c}))};
}

GptBlock::GptBlock(const GptConfig& c, const Mesh& mesh, uint64_t seed)
    : ln1_(register_module("ln1", std::make_shared<LayerNorm>(c.width, mesh))),
      ln2_(register_module("ln2", std::make_shared<LayerNorm>(c.width, mesh))),
      attn_(register_module("attn", std::make_shared<CausalSelfAttention>(c, mesh, seed))),
      fc_(register_module("fc", dense(c.width, 4 * c.width, mesh, seed + 10))),
      proj_(register_module("proj", dense(4 * c.width, c.width, mesh, seed + 11))) {}

std::vector<Tensor> GptBlock::forward(const std::vector<Tensor>& inputs) {
  Tensor x = inputs.at(0);
  x = x + (*attn_)((*ln1_)(x));
  return {x + (*proj_)(gelu((*fc_)((*ln2_)(x)), true))};
}

Gpt::Gpt(const GptConfig& c, const Mesh& mesh)
    : config_(checked_gpt_config(c, "Gpt")),
      tokens_(register_module("tokens", std::make_shared<Embedding>(c.vocab, c.width, mesh, c.seed))),
      positions_(register_module("positions", std::make_shared<Embedding>(c.context, c.width, mesh, c.seed + 1))),
      ln_f_(nullptr),
      head_(nullptr) {
  for (int64_t l = 0; l < c.layers; ++l)
    blocks_.push_back(register_module("block" + std::to_string(l), std::make_shared<GptBlock>(c, mesh, c.seed + 100 * uint64_t(l + 1))));
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(c.width, mesh));
  head_ = register_module("head", dense(c.width, c.vocab, mesh, c.seed + 2));
}

std::vector<Tensor> Gpt::forward(const std::vector<Tensor>& inputs) {
  const Tensor& ids = inputs.at(0);
  if (ids.rank() != 2 || ids.shape()[1] > config_.context)
    throw ShapeError("Gpt: ids must be [batch, time] with time <= context " + std::to_string(config_.context) + ", got " +
                     shape_string(ids.shape()));
  const int64_t t = ids.shape()[1];
  // Positions 0..T-1: an iota replicated on the ids' mesh.
  Tensor positions = iota({t}, 0, Layout::replicated(ids.device_mesh(), 1));
  Tensor x = (*tokens_)(ids) + (*positions_)(positions);
  for (const auto& block : blocks_) {
    auto run = [&block](const Tensor& in) { return (*block)(in); };
    x = config_.activation_checkpointing ? checkpoint(run, *config_.activation_checkpointing)(x) : run(x);
  }
  return {(*head_)((*ln_f_)(x))};
}

ParallelizePlan gpt_tensor_parallel_plan(const GptConfig& c, bool sequence_parallel) {
  // With sequence parallelism the residual stream between the blocks' matmuls is Shard(1) over
  // the sequence: the row-parallel projections reduce_scatter into it instead of all_reducing,
  // and each block's input is all_gathered once, where its column-parallel layers need it whole.
  const Placement residual = sequence_parallel ? Placement{Shard{1}} : Placement{Replicate{}};
  ParallelizePlan plan = {{"tokens", RowwiseParallel{Replicate{}, residual}}};
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = "block" + std::to_string(l) + ".";
    if (sequence_parallel) {
      for (const char* norm : {"ln1", "ln2"}) plan.push_back({b + norm, SequenceParallel{}});
      plan.push_back({b + "attn", PrepareModuleInput{{Replicate{}}}});
    }
    for (const char* name : {"attn.q", "attn.k", "attn.v", "fc"}) plan.push_back({b + name, ColwiseParallel{}});
    plan.push_back({b + "attn.proj", RowwiseParallel{Shard{-1}, residual}});
    plan.push_back({b + "proj", RowwiseParallel{Shard{-1}, residual}});
  }
  if (sequence_parallel) plan.push_back({"ln_f", SequenceParallel{}});
  plan.push_back({"head", ColwiseParallel{Replicate{}, Shard{-1}}});
  return plan;
}

void distribute_gpt(Gpt& model, const Mesh& mesh, bool sequence_parallel, bool fsdp) {
  if (fsdp && !mesh.contains_dim("dp")) throw Error("fsdp shards parameters over the dp mesh dim; the mesh " + mesh.to_string() + " has none");
  if (sequence_parallel && !mesh.contains_dim("tp"))
    throw Error("sequence parallelism shards the sequence over the tp mesh dim; the mesh " + mesh.to_string() + " has none");
  if (mesh.contains_dim("tp")) parallelize_module(model, mesh, gpt_tensor_parallel_plan(model.config(), sequence_parallel), "tp");
  const std::optional<MixedPrecisionPolicy>& policy = model.config().mixed_precision;
  if (fsdp) fully_shard(model, mesh, policy.value_or(MixedPrecisionPolicy{}), "dp");
  else if (policy) apply_mixed_precision(model, *policy);
}

// Over [B, T] as it is: merged into [B*T] rows, positions sharded over sp would be gathered.
Tensor gpt_loss(const Tensor& logits, const Tensor& targets) { return cross_entropy(logits, targets); }

}  // namespace tessera
