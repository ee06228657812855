#include "nn/pipelined_gpt.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "dsl/activations.hpp"
#include "dsl/autodiff.hpp"
#include "dsl/attention.hpp"
#include "dsl/error.hpp"
#include "dsl/normalization.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

// A stacked parameter [P V, shape...]: row s V + v (device s's virtual stage v) made by
// make(block) for blocks[row] >= 0, zeros for -1; axis 0 over the pp dim (each device holds its
// V rows) and `tp_axis` (of the stacked shape; -1: none) over tp.
using MakeEntry = std::function<Tensor(int64_t block, const Layout& layout)>;

Variable stacked_parameter(const StageContext& context, const std::vector<int64_t>& blocks, std::vector<int64_t> shape, int64_t tp_axis,
                           const MakeEntry& make) {
  const Mesh& mesh = context.mesh;
  const Layout entry_layout = Layout::replicated(mesh, int64_t(shape.size()));
  std::vector<int64_t> one = shape;
  one.insert(one.begin(), 1);
  std::vector<Tensor> entries;
  for (int64_t block : blocks) entries.push_back(reshape(block >= 0 ? make(block, entry_layout) : zeros(shape, entry_layout), one));
  Layout layout = stacked_layout(mesh, int64_t(shape.size()) + 1, -1, context.mesh_dim);
  if (tp_axis >= 0 && mesh.contains_dim("tp")) layout = layout.with_placement(mesh.dim_index("tp"), Shard{tp_axis});
  return Variable(with_layout(concat(entries, 0), layout));
}

// What each device runs this tick: the rows of a stacked parameter [P V, ...] for each device's
// virtual stage, [P, ...], selected through masks that are this tick's own nodes. Were two
// ticks to share a node on a parameter's path (hash-consing returns equal nodes), autodiff
// would sum their gradient terms there first, and the parameter's terms would meet in an
// order that depends on the stage count. One node per tick, whatever P and V, gives every
// mesh the accumulation of one device: bitwise the same gradients (with one virtual stage too,
// so GPipe on P devices and one device running the same microbatches agree).
Tensor this_tick(const Tensor& all, const StageContext& context) {
  const int64_t p = context.stages, v_count = context.virtual_stages;
  std::vector<int64_t> split = all.shape(), rest(split.begin() + 1, split.end());
  split[0] = v_count;
  split.insert(split.begin(), p);
  const Tensor rows = reshape(all, split);  // [P, V, ...]: device s's rows on device s
  std::vector<int64_t> piece_shape = rest;
  piece_shape.insert(piece_shape.begin(), p);
  const int64_t offset = context.tick * p;
  const Tensor indices = stage_indices(context.mesh, context.mesh_dim, offset);
  std::optional<Tensor> chosen;
  std::vector<bool> done(size_t(v_count), false);
  for (int64_t v : context.virtual_stage) {
    if (done[size_t(v)]) continue;
    done[size_t(v)] = true;
    std::vector<int64_t> begin(split.size(), 0), size = split;
    begin[1] = v, size[1] = 1;
    const Tensor piece = reshape(slice(rows, begin, size), piece_shape);
    std::vector<bool> running(context.virtual_stage.size());
    for (size_t s = 0; s < running.size(); ++s) running[s] = context.virtual_stage[s] == v;
    // The first piece goes through a where too (zeros elsewhere, where the next pieces go), so
    // that even a tick whose devices all run one virtual stage selects through a node of its own.
    const Tensor mask = stage_mask(indices, running, piece_shape, offset);
    chosen = chosen ? where(mask, piece, *chosen) : where(mask, piece, 0.0);
  }
  return *chosen;
}

// A stacked activation [P, B, T, ...] between layers: stacked_layout, and with Megatron's
// sequence parallelism its positions over tp too.
Layout activation_layout(const StageContext& context, int64_t rank) {
  const Layout layout = stacked_layout(context.mesh, rank, 1, context.mesh_dim);
  return context.sequence_parallel ? layout.with_placement(context.mesh.dim_index("tp"), Shard{2}) : layout;
}

// [P, 1, ..., 1, n] from a stacked [P, n], to broadcast against x [P, ..., n].
Tensor per_stage(const Tensor& stacked, int64_t rank) {
  std::vector<int64_t> shape(size_t(rank), 1);
  shape.front() = stacked.shape()[0];
  shape.back() = stacked.shape()[1];
  return reshape(stacked, shape);
}

// Dense (nn/dense.hpp) for every stage: y[s] = x[s] @ weight[s] + bias[s], Xavier weights.
// Megatron's splits on tp: by output column (bias split alike) or by input row (bias whole).
enum class TensorSplit { Column, Row };

class StackedDense : public Module {
 public:
  StackedDense(int64_t in, int64_t out, std::shared_ptr<const StageContext> context, const std::vector<int64_t>& blocks,
               const std::function<uint64_t(int64_t block)>& seed, TensorSplit split)
      : context_(std::move(context)), split_(split) {
    const double limit = std::sqrt(6.0 / double(in + out));
    register_parameter("weight", stacked_parameter(*context_, blocks, {in, out}, split == TensorSplit::Column ? 2 : 1,
                                                   [&](int64_t block, const Layout& layout) {
                                                     return random_uniform({in, out}, seed(block), layout, -limit, limit);
                                                   }));
    register_parameter("bias", stacked_parameter(*context_, blocks, {out}, split == TensorSplit::Column ? 1 : -1,
                                                 [&](int64_t, const Layout& layout) { return zeros({out}, layout); }));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    Tensor x = inputs.at(0);  // [P, ..., in]
    const Mesh& mesh = context_->mesh;
    // Megatron's sequence parallelism: a column split reads every position, gathered over tp.
    if (split_ == TensorSplit::Column && context_->sequence_parallel) x = with_layout(x, stacked_layout(mesh, x.rank(), 1, context_->mesh_dim));
    const std::vector<int64_t>& s = x.shape();
    int64_t rows = 1;
    for (size_t a = 1; a + 1 < s.size(); ++a) rows *= s[a];
    const Tensor weight = this_tick(parameter_value("weight"), *context_);
    Tensor y = matmul(reshape(x, {s.front(), rows, s.back()}), weight);
    std::vector<int64_t> shape = s;
    shape.back() = weight.shape()[2];
    // Megatron's layouts, as ColwiseParallel and RowwiseParallel leave them: a column split's
    // output sharded by feature over tp, a row split's summed there once, right here (with
    // sequence parallelism, summed and split by position: a reduce_scatter).
    Layout out = split_ == TensorSplit::Row ? activation_layout(*context_, x.rank()) : stacked_layout(mesh, x.rank(), 1, context_->mesh_dim);
    if (split_ == TensorSplit::Column && mesh.contains_dim("tp")) out = out.with_placement(mesh.dim_index("tp"), Shard{x.rank() - 1});
    return {with_layout(reshape(y, shape) + per_stage(this_tick(parameter_value("bias"), *context_), x.rank()), out)};
  }

 private:
  std::shared_ptr<const StageContext> context_;
  TensorSplit split_;
};

class StackedLayerNorm : public Module {
 public:
  StackedLayerNorm(int64_t dim, std::shared_ptr<const StageContext> context, const std::vector<int64_t>& blocks)
      : context_(std::move(context)) {
    register_parameter("weight", stacked_parameter(*context_, blocks, {dim}, -1,
                                                   [&](int64_t, const Layout& layout) { return ones({dim}, layout); }));
    register_parameter("bias", stacked_parameter(*context_, blocks, {dim}, -1,
                                                 [&](int64_t, const Layout& layout) { return zeros({dim}, layout); }));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);
    // layer_norm's own affine step, (normalised * weight) + bias, with each stage's weights.
    return {layer_norm(x) * per_stage(this_tick(parameter_value("weight"), *context_), x.rank()) +
            per_stage(this_tick(parameter_value("bias"), *context_), x.rank())};
  }

 private:
  std::shared_ptr<const StageContext> context_;
};

class StackedAttention : public Module {
 public:
  StackedAttention(const GptConfig& c, const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks)
      : heads_(c.heads) {
    if (c.width % c.heads != 0)
      throw ShapeError("PipelinedGpt: width " + std::to_string(c.width) + " is not a multiple of " + std::to_string(c.heads) + " heads");
    // CausalSelfAttention's seeds: the block's seed, then + 1, + 2, + 3 (nn/gpt.cpp).
    auto dense = [&](int64_t offset, TensorSplit split) {
      return std::make_shared<StackedDense>(c.width, c.width, context, blocks,
                                            [&c, offset](int64_t block) { return c.seed + 100 * uint64_t(block + 1) + uint64_t(offset); }, split);
    };
    q_ = register_module("q", dense(0, TensorSplit::Column));
    k_ = register_module("k", dense(1, TensorSplit::Column));
    v_ = register_module("v", dense(2, TensorSplit::Column));
    proj_ = register_module("proj", dense(3, TensorSplit::Row));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);  // [P, B, T, C]
    const int64_t p = x.shape()[0], b = x.shape()[1], t = x.shape()[2], c = x.shape()[3], d = c / heads_;
    // [P, B, T, C] -> [P, B, H, T, D]: attention is batched over the leading axes.
    auto split_heads = [&](const Tensor& y) { return transpose(reshape(y, {p, b, t, heads_, d}), {0, 1, 3, 2, 4}); };
    const Tensor attended = scaled_dot_product_attention(split_heads((*q_)(x)), split_heads((*k_)(x)), split_heads((*v_)(x)), true);
    return {(*proj_)(reshape(transpose(attended, {0, 1, 3, 2, 4}), {p, b, t, c}))};
  }

 private:
  int64_t heads_;
  std::shared_ptr<StackedDense> q_, k_, v_, proj_;
};

}  // namespace

StackedGptBlock::StackedGptBlock(const GptConfig& c, const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks) {
  // GptBlock's registration order (ln1, ln2, attn, fc, proj), so parameters() lists a slot's
  // tensors in the order Gpt lists a block's.
  register_module("ln1", std::make_shared<StackedLayerNorm>(c.width, context, blocks));
  register_module("ln2", std::make_shared<StackedLayerNorm>(c.width, context, blocks));
  register_module("attn", std::make_shared<StackedAttention>(c, context, blocks));
  auto seed = [&c](uint64_t offset) { return [&c, offset](int64_t block) { return c.seed + 100 * uint64_t(block + 1) + offset; }; };
  register_module("fc", std::make_shared<StackedDense>(c.width, 4 * c.width, context, blocks, seed(10), TensorSplit::Column));
  register_module("proj", std::make_shared<StackedDense>(4 * c.width, c.width, context, blocks, seed(11), TensorSplit::Row));
}

std::vector<Tensor> StackedGptBlock::forward(const std::vector<Tensor>& inputs) {
  Tensor x = inputs.at(0);
  x = x + get_submodule("attn")(get_submodule("ln1")(x));
  return {x + get_submodule("proj")(gelu(get_submodule("fc")(get_submodule("ln2")(x)), true))};
}

PipelinedGpt::PipelinedGpt(const GptConfig& c, const Mesh& mesh, int64_t virtual_stages, std::string mesh_dim)
    : config_(checked_gpt_config(c, "PipelinedGpt")), context_(std::make_shared<StageContext>()) {
  if (virtual_stages < 1) throw Error("PipelinedGpt: virtual stages must be positive, got " + std::to_string(virtual_stages));
  context_->mesh = mesh;
  context_->mesh_dim = std::move(mesh_dim);
  context_->stages = pipeline_stage_count(mesh, context_->mesh_dim);
  context_->virtual_stages = virtual_stages;
  context_->virtual_stage.assign(size_t(context_->stages), 0);
  const int64_t p = context_->stages, v_count = virtual_stages;
  // Chunk v P + s is device s's virtual stage v; its blocks follow the chunks before it.
  chunk_blocks_ = split_blocks(c.layers, p * v_count);
  std::vector<int64_t> first_block(chunk_blocks_.size(), 0);
  for (size_t chunk = 1; chunk < chunk_blocks_.size(); ++chunk) first_block[chunk] = first_block[chunk - 1] + chunk_blocks_[chunk - 1];
  // The same seeds as Gpt (nn/gpt.cpp), so both start from the same weights.
  tokens_ = register_module("tokens", std::make_shared<Embedding>(c.vocab, c.width, mesh, c.seed));
  positions_ = register_module("positions", std::make_shared<Embedding>(c.context, c.width, mesh, c.seed + 1));
  for (int64_t slot = 0; slot < chunk_blocks_.front(); ++slot) {
    std::vector<int64_t> blocks;  // by stacked row s V + v
    for (int64_t s = 0; s < p; ++s)
      for (int64_t v = 0; v < v_count; ++v) {
        const size_t chunk = size_t(v * p + s);
        blocks.push_back(slot < chunk_blocks_[chunk] ? first_block[chunk] + slot : -1);
      }
    slots_.push_back(register_module("slot" + std::to_string(slot), std::make_shared<StackedGptBlock>(c, context_, blocks)));
  }
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(c.width, mesh));
  head_ = register_module("head", std::make_shared<Dense>(c.width, c.vocab, Layout::replicated(mesh, 2), c.seed + 2));
}

Tensor PipelinedGpt::embed(const Tensor& ids) {
  if (ids.rank() != 2 || ids.shape()[1] > config_.context)
    throw ShapeError("PipelinedGpt: ids must be [batch, time] with time <= context " + std::to_string(config_.context) + ", got " +
                     shape_string(ids.shape()));
  const Tensor positions = iota({ids.shape()[1]}, 0, Layout::replicated(ids.device_mesh(), 1));
  return (*tokens_)(ids) + (*positions_)(positions);
}

Tensor PipelinedGpt::stages_forward(const Tensor& stacked, int64_t tick, const std::vector<int64_t>& virtual_stage) {
  context_->tick = tick;  // what the stacked layers select this tick
  context_->virtual_stage = virtual_stage;
  const int64_t p = context_->stages;
  const Tensor indices = stage_indices(context_->mesh, context_->mesh_dim);
  Tensor x = stacked;
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    const auto& block = slots_[slot];
    auto run = [&block](const Tensor& in) { return (*block)(in); };
    const Tensor y = config_.activation_checkpointing ? checkpoint(run, *config_.activation_checkpointing)(x) : run(x);
    // Devices whose chunk has fewer blocks pass their value through this slot.
    std::vector<bool> holding(static_cast<size_t>(p), false);
    for (int64_t s = 0; s < p; ++s) holding[size_t(s)] = chunk_blocks_[size_t(virtual_stage[size_t(s)] * p + s)] > int64_t(slot);
    x = std::count(holding.begin(), holding.end(), true) == p ? y : where(stage_mask(indices, holding, x.shape()), y, x);
  }
  return x;
}

PipelineSpec PipelinedGpt::spec(const Tensor& ids, int64_t microbatches) {
  if (!(ids.device_mesh() == context_->mesh))
    throw LayoutError("PipelinedGpt: ids are on " + ids.device_mesh().to_string() + ", the model on " + context_->mesh.to_string());
  PipelineSpec spec;
  spec.mesh_dim = context_->mesh_dim;
  spec.microbatches = microbatches;
  spec.virtual_stages = context_->virtual_stages;
  spec.first = [this, ids, microbatches](int64_t m) { return embed(microbatches == 1 ? ids : microbatch(ids, m, microbatches)); };
  spec.stages = [this](const Tensor& stacked, int64_t tick, const std::vector<int64_t>& virtual_stage) {
    return stages_forward(stacked, tick, virtual_stage);
  };
  spec.state_layout = activation_layout(*context_, 4);
  return spec;
}

Tensor PipelinedGpt::logits(const Tensor& last_output) {
  Tensor h = (*head_)((*ln_f_)(last_output));
  // The policy's output dtype, as the hook apply_mixed_precision installs on Gpt casts its logits.
  if (const auto& policy = mixed_precision()) h = cast(h, policy->output_dtype);
  return h;
}

std::vector<Tensor> PipelinedGpt::run_stages(const Tensor& ids, int64_t microbatches) {
  std::vector<Tensor> outputs = run_pipeline(spec(ids, microbatches));
  for (Tensor& h : outputs) h = logits(h);
  return outputs;
}

std::vector<Tensor> PipelinedGpt::forward(const std::vector<Tensor>& inputs) { return run_stages(inputs.at(0), 1); }

Tensor PipelinedGpt::loss(const Tensor& ids, const Tensor& targets, int64_t microbatches) {
  const std::vector<Tensor> logits = run_stages(ids, microbatches);
  std::optional<Tensor> total;
  for (int64_t m = 0; m < microbatches; ++m) {
    const Tensor l = gpt_loss(logits[size_t(m)], microbatches == 1 ? targets : microbatch(targets, m, microbatches));
    total = total ? *total + l : l;
  }
  return microbatches == 1 ? *total : *total / double(microbatches);
}

std::pair<Tensor, std::vector<Tensor>> PipelinedGpt::loss_and_gradients(const Tensor& ids, const Tensor& targets, int64_t microbatches,
                                                                       PipelineSchedule schedule) {
  const auto named = named_parameters();
  std::vector<Tensor> all;
  for (const auto& [name, p] : named) all.push_back(p);
  if (pipeline_schedule_loops(schedule) != (virtual_stages() > 1))
    throw Error(std::string("PipelinedGpt: the ") + pipeline_schedule_name(schedule) + " schedule with " + std::to_string(virtual_stages()) +
                " virtual stage(s) per device; looped-bfs and interleaved-1f1b run several, gpipe and 1f1b one");
  if (schedule == PipelineSchedule::GPipe || schedule == PipelineSchedule::LoopedBFS) {
    const Tensor l = loss(ids, targets, microbatches);
    return {l, gradients(l, all)};
  }
  // Parameters by part: the embeddings feed stage 0, the slots are the stages, ln_f and head follow.
  PipelineLoss parts;
  for (const auto& [name, p] : named)
    (name.rfind("slot", 0) == 0 ? parts.stage_parameters : parts.stage_parameters.empty() ? parts.first_parameters : parts.last_parameters)
        .push_back(p);
  parts.loss = [&](const Tensor& last_output, int64_t m) {
    return gpt_loss(logits(last_output), microbatches == 1 ? targets : microbatch(targets, m, microbatches));
  };
  PipelineGradients g = run_pipeline_1f1b(spec(ids, microbatches), parts);
  std::vector<Tensor> grads = g.first;
  grads.insert(grads.end(), g.stages.begin(), g.stages.end());
  grads.insert(grads.end(), g.last.begin(), g.last.end());
  return {g.loss, grads};
}

std::vector<Tensor> PipelinedGpt::gradient_squares(const std::vector<Tensor>& grads) const {
  const auto named = named_parameters();
  if (grads.size() != named.size())
    throw Error("PipelinedGpt::gradient_squares: " + std::to_string(grads.size()) + " gradients for " + std::to_string(named.size()) +
                " parameters");
  auto squares = [](const Tensor& g, std::vector<int64_t> axes) { return reduce_sum(square(cast(g, DType::f64)), axes, false); };
  const int64_t rows = context_->stages * context_->virtual_stages;
  std::vector<Tensor> before, after;  // the embeddings; ln_f and head
  std::vector<Tensor> stacked;        // every slot parameter's squares per stacked row, [P V, 1] each
  std::vector<size_t> slot_of;        // its slot
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].first;
    if (name.rfind("slot", 0) == 0) {
      std::vector<int64_t> axes;
      for (int64_t a = 1; a < grads[i].rank(); ++a) axes.push_back(a);
      stacked.push_back(reshape(squares(grads[i], axes), {rows, 1}));
      slot_of.push_back(size_t(std::stoll(name.substr(4, name.find('.') - 4))));
    } else {
      (stacked.empty() ? before : after).push_back(squares(grads[i], {}));
    }
  }
  // One gather of every row's squares [P V, K] (not one per block and parameter), then each
  // block's parameters in Gpt's order: chunk by chunk, block by block.
  const Tensor all = with_layout(concat(stacked, 1), Layout::replicated(context_->mesh, 2));
  std::vector<Tensor> out = before;
  const int64_t p = context_->stages;
  for (size_t chunk = 0; chunk < chunk_blocks_.size(); ++chunk) {
    const int64_t s = int64_t(chunk) % p, v = int64_t(chunk) / p, row = s * context_->virtual_stages + v;
    for (int64_t slot = 0; slot < chunk_blocks_[chunk]; ++slot)
      for (size_t k = 0; k < stacked.size(); ++k)
        if (slot_of[k] == size_t(slot)) out.push_back(reshape(slice(all, {row, int64_t(k)}, {1, 1}), {}));
  }
  out.insert(out.end(), after.begin(), after.end());
  return out;
}

void PipelinedGpt::use_sequence_parallelism() {
  if (!context_->mesh.contains_dim("tp"))
    throw Error("sequence parallelism shards the sequence over the tp mesh dim; the mesh " + context_->mesh.to_string() + " has none");
  context_->sequence_parallel = true;
}

void distribute_pipelined_gpt(PipelinedGpt& model, const Mesh& mesh, bool fsdp, bool sequence_parallel) {
  if (fsdp && !mesh.contains_dim("dp")) throw Error("fsdp shards parameters over the dp mesh dim; the mesh " + mesh.to_string() + " has none");
  if (sequence_parallel) model.use_sequence_parallelism();
  const std::optional<MixedPrecisionPolicy>& policy = model.config().mixed_precision;
  if (fsdp) fully_shard(model, mesh, policy.value_or(MixedPrecisionPolicy{}), "dp");
  else if (policy) apply_mixed_precision(model, *policy);
}

}  // namespace tessera
