#include "nn/transformer.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsl/activations.hpp"
#include "dsl/attention.hpp"
#include "dsl/checkpoint.hpp"
#include "dsl/error.hpp"
#include "dsl/ops.hpp"
#include "dsl/ring_attention.hpp"
#include "dsl/string_util.hpp"
#include "nn/dense.hpp"
#include "nn/layers.hpp"
#include "nn/linear.hpp"
#include "nn/mixed_precision.hpp"
#include "nn/moe.hpp"
#include "nn/rotary.hpp"

namespace tessera {
namespace {

// The GPT-2 family's projections (biases) are Dense's: Xavier-uniform weights and zero biases,
// as Tessera's GPT has always drawn them, so its curves stay what they were. The Llama family's
// are bias-free Linears with PyTorch's initialisation. Both hold "weight" [in, out] (and "bias"),
// so the parallel styles shard them alike.
std::shared_ptr<Module> block_projection(const TransformerConfig& c, int64_t in, int64_t out, const Mesh& mesh, uint64_t seed) {
  if (c.bias) return std::make_shared<Dense>(in, out, Layout::replicated(mesh, 2), seed);
  return std::make_shared<Linear>(in, out, mesh, seed);
}

std::shared_ptr<Module> block_norm(const TransformerConfig& c, const Mesh& mesh) {
  if (c.norm == NormKind::RMSNorm) return std::make_shared<RMSNorm>(c.dim, mesh, c.norm_eps);
  return std::make_shared<LayerNorm>(c.dim, mesh, c.norm_eps);
}

// Seeds of layer `layer`'s parameters: a block of 100 per layer (the GPT's scheme since its start).
uint64_t layer_seed(const TransformerConfig& c, int64_t layer) { return c.seed + 100 * uint64_t(layer + 1); }

Tensor call_module(Module& module, const Tensor& x) { return module(x); }

}  // namespace

Attention::Attention(const TransformerConfig& c, const Mesh& mesh, uint64_t seed)
    : heads_(c.heads), kv_heads_(c.kv_heads), rotary_(c.positions == PositionKind::Rotary) {
  const int64_t kv_dim = c.kv_heads * c.head_dim();
  register_module("wq", block_projection(c, c.dim, c.dim, mesh, seed));
  register_module("wk", block_projection(c, c.dim, kv_dim, mesh, seed + 1));
  register_module("wv", block_projection(c, c.dim, kv_dim, mesh, seed + 2));
  register_module("wo", block_projection(c, c.dim, c.dim, mesh, seed + 3));
}

std::vector<Tensor> Attention::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() != (rotary_ ? 3u : 1u))
    throw Error("Attention: forward takes x" + std::string(rotary_ ? " and the rotary tables' cos and sin" : "") + ", got " +
                std::to_string(inputs.size()) + " inputs");
  const Tensor& x = inputs[0];
  std::optional<RotaryTables> rotary;
  if (rotary_) rotary = RotaryTables{inputs[1], inputs[2]};
  const Tensor attended = causal_self_attention(call_module(get_submodule("wq"), x), call_module(get_submodule("wk"), x),
                                                call_module(get_submodule("wv"), x), heads_, kv_heads_, rotary);
  return {call_module(get_submodule("wo"), attended)};
}

Tensor causal_self_attention(const Tensor& q_proj, const Tensor& k_proj, const Tensor& v_proj, int64_t heads, int64_t kv_heads,
                             const std::optional<RotaryTables>& rotary) {
  const int64_t r = q_proj.rank();
  if (r < 2 || k_proj.rank() != r || v_proj.rank() != r)
    throw ShapeError("causal_self_attention: q, k and v must be [..., seq, features] of one rank, got " + shape_string(q_proj.shape()) +
                     ", " + shape_string(k_proj.shape()) + ", " + shape_string(v_proj.shape()));
  const std::vector<int64_t> q_shape = q_proj.shape();
  const std::vector<int64_t> lead(q_shape.begin(), q_shape.end() - 2);
  const int64_t t = q_shape[size_t(r - 2)], c = q_shape[size_t(r - 1)], d = c / heads;
  auto shaped = [&lead](std::vector<int64_t> tail) {
    std::vector<int64_t> shape = lead;
    shape.insert(shape.end(), tail.begin(), tail.end());
    return shape;
  };
  // [..., T, C] -> [..., T, H, D]: whole heads wherever the width is split by whole heads.
  Tensor q = reshape(q_proj, shaped({t, heads, d}));
  Tensor k = reshape(k_proj, shaped({t, kv_heads, d}));
  Tensor v = reshape(v_proj, shaped({t, kv_heads, d}));
  if (rotary) q = apply_rotary(q, *rotary), k = apply_rotary(k, *rotary);
  if (kv_heads != heads) {
    // Each kv head serves heads / kv_heads consecutive query heads (torch's repeat_interleave):
    // a kv-head shard on a device lines up with that device's query heads.
    const int64_t group = heads / kv_heads;
    auto repeat = [&](const Tensor& y) {
      return reshape(broadcast_to(reshape(y, shaped({t, kv_heads, 1, d})), shaped({t, kv_heads, group, d})), shaped({t, heads, d}));
    };
    k = repeat(k), v = repeat(v);
  }
  // [..., T, H, D] <-> [..., H, T, D]
  std::vector<int64_t> order(size_t(r + 1));
  for (size_t a = 0; a < order.size(); ++a) order[a] = int64_t(a);
  std::swap(order[size_t(r - 2)], order[size_t(r - 1)]);
  auto heads_first = [&order](const Tensor& y) { return transpose(y, order); };
  // A mesh dim "cp" shards the sequence for context parallelism: ring attention over it.
  const Mesh& mesh = q.node()->mesh;
  const bool context_parallel = mesh.is_valid() && mesh.contains_dim("cp") && mesh.shape()[size_t(mesh.dim_index("cp"))] > 1;
  const Tensor attended = context_parallel ? ring_attention(heads_first(q), heads_first(k), heads_first(v), true, "cp")
                                           : scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), true);
  return reshape(transpose(attended, order), shaped({t, c}));
}

FeedForward::FeedForward(const TransformerConfig& c, int64_t hidden, const Mesh& mesh, uint64_t seed) : kind_(c.mlp) {
  register_module("w1", block_projection(c, c.dim, hidden, mesh, seed));
  register_module("w2", block_projection(c, hidden, c.dim, mesh, seed + 1));
  if (kind_ == MlpKind::SwiGLU) register_module("w3", block_projection(c, c.dim, hidden, mesh, seed + 2));
}

std::vector<Tensor> FeedForward::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() != 1) throw Error("FeedForward: forward takes one input, got " + std::to_string(inputs.size()));
  const Tensor& x = inputs[0];
  const Tensor up = call_module(get_submodule("w1"), x);
  const Tensor hidden = kind_ == MlpKind::SwiGLU ? silu(up) * call_module(get_submodule("w3"), x) : gelu(up, true);
  return {call_module(get_submodule("w2"), hidden)};
}

TransformerBlock::TransformerBlock(const TransformerConfig& c, int64_t layer, const Mesh& mesh) {
  const uint64_t seed = layer_seed(c, layer);
  register_module("attention_norm", block_norm(c, mesh));
  register_module("attention", std::make_shared<Attention>(c, mesh, seed));
  register_module("ffn_norm", block_norm(c, mesh));
  if (c.is_moe_layer(layer)) moe_ = register_module("moe", std::make_shared<MoE>(c, mesh, seed + 10));
  else register_module("feed_forward", std::make_shared<FeedForward>(c, c.hidden, mesh, seed + 10));
}

std::vector<Tensor> TransformerBlock::forward(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> attention_inputs = inputs;
  attention_inputs.at(0) = call_module(get_submodule("attention_norm"), inputs.at(0));
  const Tensor h = inputs[0] + get_submodule("attention")(attention_inputs).at(0);
  return {h + call_module(get_submodule(moe_ ? "moe" : "feed_forward"), call_module(get_submodule("ffn_norm"), h))};
}

Transformer::Transformer(const TransformerConfig& config, const Mesh& mesh) : Transformer(config, mesh, "Transformer") {}

Transformer::Transformer(const TransformerConfig& config, const Mesh& mesh, std::string who)
    : config_(checked_transformer_config(config)), who_(std::move(who)) {
  const TransformerConfig& c = config_;
  if (c.positions == PositionKind::Rotary && c.head_dim() % 2 != 0)
    throw ShapeError(who_ + ": rotary embeddings need an even head_dim, got " + std::to_string(c.head_dim()));
  tok_embeddings_ = register_module("tok_embeddings", std::make_shared<Embedding>(c.vocab, c.dim, mesh, c.seed));
  if (c.positions == PositionKind::Learned)
    pos_embeddings_ = register_module("pos_embeddings", std::make_shared<Embedding>(c.max_seq, c.dim, mesh, c.seed + 1));
  layers_ = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t l = 0; l < c.layers; ++l) layers_->append(std::make_shared<TransformerBlock>(c, l, mesh));
  norm_ = register_module("norm", block_norm(c, mesh));
  if (!c.tied_embeddings) output_ = register_module("output", block_projection(c, c.dim, c.vocab, mesh, c.seed + 2));
}

std::vector<MoE*> Transformer::moe_layers() const {
  std::vector<MoE*> layers;
  for (const std::shared_ptr<Module>& layer : *layers_)
    if (MoE* moe = static_cast<TransformerBlock&>(*layer).moe()) layers.push_back(moe);
  return layers;
}

Tensor Transformer::moe_aux_loss() const {
  std::optional<Tensor> total;
  for (MoE* moe : moe_layers()) total = total ? *total + moe->aux_loss() : moe->aux_loss();
  if (!total) throw Error(who_ + ": moe_aux_loss() of a model without MoE layers");
  return *total;
}

std::vector<Tensor> Transformer::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() != 1) throw Error(who_ + ": forward takes the ids, got " + std::to_string(inputs.size()) + " inputs");
  const Tensor& ids = inputs[0];
  if (ids.rank() != 2 || ids.shape()[1] > config_.max_seq)
    throw ShapeError(who_ + ": ids must be [batch, time] with time <= context " + std::to_string(config_.max_seq) + ", got " +
                     shape_string(ids.shape()));
  const int64_t t = ids.shape()[1];
  const Mesh& mesh = ids.device_mesh();
  Tensor x = call_module(*tok_embeddings_, ids);
  std::vector<Tensor> tables;  // the rotary tables every block's attention reads
  if (pos_embeddings_) x = x + call_module(*pos_embeddings_, iota({t}, 0, Layout::replicated(mesh, 1)));
  else {
    const RotaryTables rotary = rotary_tables(config_, t, mesh);
    tables = {rotary.cos, rotary.sin};
  }
  for (const std::shared_ptr<Module>& layer : *layers_) {
    auto run = [&layer, &tables](const Tensor& in) {
      std::vector<Tensor> block_inputs = {in};
      block_inputs.insert(block_inputs.end(), tables.begin(), tables.end());
      return (*layer)(block_inputs).at(0);
    };
    x = config_.activation_checkpointing ? checkpoint(run, *config_.activation_checkpointing)(x) : run(x);
  }
  x = call_module(*norm_, x);
  if (output_) return {call_module(*output_, x)};
  // Tied: the embedding table [vocab, dim] is the output projection's [dim, vocab] transposed.
  return {matmul(x, transpose(tok_embeddings_->parameter_value("weight")))};
}

ParallelizePlan transformer_tensor_parallel_plan(const TransformerConfig& c, bool sequence_parallel) {
  // With sequence parallelism the residual stream between the blocks' matmuls is Shard(1) over
  // the sequence: the row-parallel projections reduce_scatter into it instead of all_reducing,
  // and attention's and feed_forward's inputs are all_gathered once each.
  const Placement residual = sequence_parallel ? Placement{Shard{1}} : Placement{Replicate{}};
  ParallelizePlan plan = {{"tok_embeddings", RowwiseParallel{Replicate{}, residual}}};
  const bool rotary = c.positions == PositionKind::Rotary;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = "layers." + std::to_string(l) + ".";
    if (sequence_parallel) {
      for (const char* norm : {"attention_norm", "ffn_norm"}) plan.push_back({b + norm, SequenceParallel{}});
      // The rotary tables (inputs 2 and 3) are replicated already.
      std::vector<std::optional<Placement>> attention_inputs = {Replicate{}};
      if (rotary) attention_inputs.insert(attention_inputs.end(), {std::nullopt, std::nullopt});
      plan.push_back({b + "attention", PrepareModuleInput{attention_inputs}});
      plan.push_back({b + (c.is_moe_layer(l) ? "moe" : "feed_forward"), PrepareModuleInput{{Replicate{}}}});
    }
    for (const char* name : {"attention.wq", "attention.wk", "attention.wv"}) plan.push_back({b + name, ColwiseParallel{}});
    plan.push_back({b + "attention.wo", RowwiseParallel{Shard{-1}, residual}});
    // A MoE layer's experts run on whole tokens, split over ep rather than tp.
    if (c.is_moe_layer(l)) continue;
    plan.push_back({b + "feed_forward.w1", ColwiseParallel{}});
    if (c.mlp == MlpKind::SwiGLU) plan.push_back({b + "feed_forward.w3", ColwiseParallel{}});
    plan.push_back({b + "feed_forward.w2", RowwiseParallel{Shard{-1}, residual}});
  }
  if (sequence_parallel) plan.push_back({"norm", SequenceParallel{}});
  if (!c.tied_embeddings) plan.push_back({"output", ColwiseParallel{Replicate{}, Shard{-1}}});
  return plan;
}

void distribute_transformer(Transformer& model, const Mesh& mesh, bool sequence_parallel, bool fsdp) {
  if (fsdp && !mesh.contains_dim("dp")) throw Error("fsdp shards parameters over the dp mesh dim; the mesh " + mesh.to_string() + " has none");
  if (sequence_parallel && !mesh.contains_dim("tp"))
    throw Error("sequence parallelism shards the sequence over the tp mesh dim; the mesh " + mesh.to_string() + " has none");
  if (mesh.contains_dim("tp")) parallelize_module(model, mesh, transformer_tensor_parallel_plan(model.config(), sequence_parallel), "tp");
  if (mesh.contains_dim("ep"))
    for (MoE* moe : model.moe_layers()) moe->parallelize_experts(mesh, "ep");
  const std::optional<MixedPrecisionPolicy>& policy = model.config().mixed_precision;
  if (fsdp) fully_shard(model, mesh, policy.value_or(MixedPrecisionPolicy{}), "dp");
  else if (policy) apply_mixed_precision(model, *policy);
}

}  // namespace tessera
