#include "nn/pipelined_gpt.hpp"

#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "dsl/activations.hpp"
#include "dsl/attention.hpp"
#include "dsl/error.hpp"
#include "dsl/normalization.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

// A stacked parameter [P, shape...]: stage s's entry made by make(block) for blocks[s] >= 0,
// zeros for -1; axis 0 over the pp dim and `tp_axis` (of the stacked shape; -1: none) over tp.
using MakeEntry = std::function<Tensor(int64_t block, const Layout& layout)>;

Variable stacked_parameter(const Mesh& mesh, const std::string& mesh_dim, const std::vector<int64_t>& blocks, std::vector<int64_t> shape,
                           int64_t tp_axis, const MakeEntry& make) {
  const Layout entry_layout = Layout::replicated(mesh, int64_t(shape.size()));
  std::vector<int64_t> one = shape;
  one.insert(one.begin(), 1);
  std::vector<Tensor> entries;
  for (int64_t block : blocks) entries.push_back(reshape(block >= 0 ? make(block, entry_layout) : zeros(shape, entry_layout), one));
  std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
  for (size_t d = 0; d < placements.size(); ++d) {
    if (mesh.dim_names()[d] == mesh_dim) placements[d] = Shard{0};
    if (mesh.dim_names()[d] == "tp" && tp_axis >= 0) placements[d] = Shard{tp_axis};
  }
  return Variable(with_layout(concat(entries, 0), Layout::from_placements(mesh, placements, int64_t(shape.size()) + 1)));
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
  StackedDense(int64_t in, int64_t out, const Mesh& mesh, const std::string& mesh_dim, const std::vector<int64_t>& blocks,
               const std::function<uint64_t(int64_t block)>& seed, TensorSplit split)
      : mesh_(mesh), mesh_dim_(mesh_dim), split_(split) {
    const double limit = std::sqrt(6.0 / double(in + out));
    register_parameter("weight", stacked_parameter(mesh, mesh_dim, blocks, {in, out}, split == TensorSplit::Column ? 2 : 1,
                                                   [&](int64_t block, const Layout& layout) {
                                                     return random_uniform({in, out}, seed(block), layout, -limit, limit);
                                                   }));
    register_parameter("bias", stacked_parameter(mesh, mesh_dim, blocks, {out}, split == TensorSplit::Column ? 1 : -1,
                                                 [&](int64_t, const Layout& layout) { return zeros({out}, layout); }));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);  // [P, ..., in]
    const std::vector<int64_t>& s = x.shape();
    int64_t rows = 1;
    for (size_t a = 1; a + 1 < s.size(); ++a) rows *= s[a];
    const Tensor weight = parameter_value("weight");
    Tensor y = matmul(reshape(x, {s.front(), rows, s.back()}), weight);
    std::vector<int64_t> shape = s;
    shape.back() = weight.shape()[2];
    // Megatron's layouts, as ColwiseParallel and RowwiseParallel leave them: a column split's
    // output sharded by feature over tp, a row split's summed there once, right here.
    Layout out = stacked_layout(mesh_, x.rank(), 1, mesh_dim_);
    if (split_ == TensorSplit::Column && mesh_.contains_dim("tp")) out = out.with_placement(mesh_.dim_index("tp"), Shard{x.rank() - 1});
    return {with_layout(reshape(y, shape) + per_stage(parameter_value("bias"), x.rank()), out)};
  }

 private:
  Mesh mesh_;
  std::string mesh_dim_;
  TensorSplit split_;
};

class StackedLayerNorm : public Module {
 public:
  StackedLayerNorm(int64_t dim, const Mesh& mesh, const std::string& mesh_dim, const std::vector<int64_t>& blocks) {
    register_parameter("weight", stacked_parameter(mesh, mesh_dim, blocks, {dim}, -1,
                                                   [&](int64_t, const Layout& layout) { return ones({dim}, layout); }));
    register_parameter("bias", stacked_parameter(mesh, mesh_dim, blocks, {dim}, -1,
                                                 [&](int64_t, const Layout& layout) { return zeros({dim}, layout); }));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);
    // layer_norm's own affine step, (normalised * weight) + bias, with each stage's weights.
    return {layer_norm(x) * per_stage(parameter_value("weight"), x.rank()) + per_stage(parameter_value("bias"), x.rank())};
  }
};

class StackedAttention : public Module {
 public:
  StackedAttention(const GptConfig& c, const Mesh& mesh, const std::string& mesh_dim, const std::vector<int64_t>& blocks) : heads_(c.heads) {
    if (c.width % c.heads != 0)
      throw ShapeError("PipelinedGpt: width " + std::to_string(c.width) + " is not a multiple of " + std::to_string(c.heads) + " heads");
    // CausalSelfAttention's seeds: the block's seed, then + 1, + 2, + 3 (nn/gpt.cpp).
    auto dense = [&](int64_t offset, TensorSplit split) {
      return std::make_shared<StackedDense>(c.width, c.width, mesh, mesh_dim, blocks,
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

StackedGptBlock::StackedGptBlock(const GptConfig& c, const Mesh& mesh, const std::vector<int64_t>& blocks, const std::string& mesh_dim)
    : heads_(c.heads) {
  // GptBlock's registration order (ln1, ln2, attn, fc, proj), so parameters() lists a slot's
  // tensors in the order Gpt lists a block's.
  register_module("ln1", std::make_shared<StackedLayerNorm>(c.width, mesh, mesh_dim, blocks));
  register_module("ln2", std::make_shared<StackedLayerNorm>(c.width, mesh, mesh_dim, blocks));
  register_module("attn", std::make_shared<StackedAttention>(c, mesh, mesh_dim, blocks));
  auto seed = [&c](uint64_t offset) { return [&c, offset](int64_t block) { return c.seed + 100 * uint64_t(block + 1) + offset; }; };
  register_module("fc", std::make_shared<StackedDense>(c.width, 4 * c.width, mesh, mesh_dim, blocks, seed(10), TensorSplit::Column));
  register_module("proj", std::make_shared<StackedDense>(4 * c.width, c.width, mesh, mesh_dim, blocks, seed(11), TensorSplit::Row));
}

std::vector<Tensor> StackedGptBlock::forward(const std::vector<Tensor>& inputs) {
  Tensor x = inputs.at(0);
  x = x + get_submodule("attn")(get_submodule("ln1")(x));
  return {x + get_submodule("proj")(gelu(get_submodule("fc")(get_submodule("ln2")(x)), true))};
}

PipelinedGpt::PipelinedGpt(const GptConfig& c, const Mesh& mesh, std::string mesh_dim)
    : config_(c), mesh_(mesh), mesh_dim_(std::move(mesh_dim)) {
  if (c.mixed_precision) throw Error("PipelinedGpt: mixed precision with pipeline stages is not built yet; use f32");
  stage_blocks_ = split_blocks(c.layers, pipeline_stage_count(mesh, mesh_dim_));
  // The same seeds as Gpt (nn/gpt.cpp), so both start from the same weights.
  tokens_ = register_module("tokens", std::make_shared<Embedding>(c.vocab, c.width, mesh, c.seed));
  positions_ = register_module("positions", std::make_shared<Embedding>(c.context, c.width, mesh, c.seed + 1));
  for (int64_t slot = 0; slot < stage_blocks_.front(); ++slot) {
    std::vector<int64_t> blocks;
    int64_t first = 0;
    for (int64_t count : stage_blocks_) {
      blocks.push_back(slot < count ? first + slot : -1);
      first += count;
    }
    slots_.push_back(register_module("slot" + std::to_string(slot), std::make_shared<StackedGptBlock>(c, mesh, blocks, mesh_dim_)));
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

Tensor PipelinedGpt::stages_forward(const Tensor& stacked) {
  const Tensor indices = stage_indices(mesh_, mesh_dim_);
  Tensor x = stacked;
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    const auto& block = slots_[slot];
    auto run = [&block](const Tensor& in) { return (*block)(in); };
    const Tensor y = config_.activation_checkpointing ? checkpoint(run, *config_.activation_checkpointing)(x) : run(x);
    // Stages with fewer blocks pass their value through this slot (blocks per stage only fall).
    int64_t holding = 0;
    for (int64_t count : stage_blocks_) holding += count > int64_t(slot) ? 1 : 0;
    x = holding == stages() ? y : where(stage_mask(indices, 0, holding - 1, x.shape()), y, x);
  }
  return x;
}

std::vector<Tensor> PipelinedGpt::run_stages(const Tensor& ids, int64_t microbatches) {
  if (!(ids.device_mesh() == mesh_)) throw LayoutError("PipelinedGpt: ids are on " + ids.device_mesh().to_string() + ", the model on " + mesh_.to_string());
  PipelineSpec spec;
  spec.mesh_dim = mesh_dim_;
  spec.microbatches = microbatches;
  spec.first = [&](int64_t m) { return embed(microbatches == 1 ? ids : microbatch(ids, m, microbatches)); };
  spec.stages = [this](const Tensor& stacked) { return stages_forward(stacked); };
  spec.state_layout = stacked_layout(mesh_, 4, 1, mesh_dim_);
  std::vector<Tensor> outputs = run_pipeline(spec);
  for (Tensor& h : outputs) h = (*head_)((*ln_f_)(h));
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

std::vector<Tensor> PipelinedGpt::gradient_squares(const std::vector<Tensor>& grads) const {
  const auto named = named_parameters();
  if (grads.size() != named.size())
    throw Error("PipelinedGpt::gradient_squares: " + std::to_string(grads.size()) + " gradients for " + std::to_string(named.size()) +
                " parameters");
  auto squares = [](const Tensor& g, std::vector<int64_t> axes) { return reduce_sum(square(cast(g, DType::f64)), axes, false); };
  std::vector<Tensor> before, after;  // the embeddings; ln_f and head
  std::vector<Tensor> stacked;        // every slot parameter's squares per stage, [P, 1] each
  std::vector<size_t> slot_of;        // its slot
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].first;
    if (name.rfind("slot", 0) == 0) {
      std::vector<int64_t> axes;
      for (int64_t a = 1; a < grads[i].rank(); ++a) axes.push_back(a);
      stacked.push_back(reshape(squares(grads[i], axes), {stages(), 1}));
      slot_of.push_back(size_t(std::stoll(name.substr(4, name.find('.') - 4))));
    } else {
      (stacked.empty() ? before : after).push_back(squares(grads[i], {}));
    }
  }
  // One gather of every stage's squares [P, K] (not one per block and parameter), then each
  // block's parameters in Gpt's order: block by block, stage by stage.
  const Tensor all = with_layout(concat(stacked, 1), Layout::replicated(mesh_, 2));
  std::vector<Tensor> out = before;
  for (size_t s = 0; s < stage_blocks_.size(); ++s)
    for (int64_t slot = 0; slot < stage_blocks_[s]; ++slot)
      for (size_t k = 0; k < stacked.size(); ++k)
        if (slot_of[k] == size_t(slot)) out.push_back(reshape(slice(all, {int64_t(s), int64_t(k)}, {1, 1}), {}));
  out.insert(out.end(), after.begin(), after.end());
  return out;
}

}  // namespace tessera
