#include "nn/pipelined_transformer.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "dsl/activations.hpp"
#include "dsl/autodiff.hpp"
#include "dsl/error.hpp"
#include "dsl/checkpoint.hpp"
#include "dsl/gradient_rule.hpp"
#include "dsl/ops.hpp"
#include "dsl/normalization.hpp"
#include "dsl/string_util.hpp"
#include "nn/mixed_precision.hpp"
#include "nn/moe.hpp"
#include "nn/transformer.hpp"

namespace tessera {

// What the stacked layers of one PipelinedTransformer share: the mesh, its pp dim, the stage and
// virtual stage counts, which virtual stage each device runs at the tick being traced, and the
// rotary tables of the sequence being traced.
struct StageContext {
  Mesh mesh;
  std::string mesh_dim;
  int64_t stages = 1, virtual_stages = 1;
  bool sequence_parallel = false;      // Megatron's, on tp: activations between layers split by position
  int64_t tick = 0;                    // the tick being traced
  int64_t forward_ticks = 0;           // the schedule's forward ticks; 1F1B's recomputing backward numbers its ticks from here
  std::vector<int64_t> virtual_stage;  // per device, this tick
  std::vector<bool> busy;              // per device, this tick: holding a microbatch (not the bubble)
  std::optional<RotaryTables> rotary;  // rotary configs: the tables of the traced sequence length
  // MoE layers: the weight of each microbatch's balancing loss in the objective (the config's
  // coefficient over the microbatch count), set by each loss before it traces.
  double aux_loss_scale = 0;
};

namespace {

// A layer's initial parameter at `path` ("attention.wq.weight"): the stacked entries' source.
using InitialValue = std::function<Tensor(int64_t layer, const std::string& path)>;

// How a stacked parameter is split beyond pp: (mesh dim, axis of the stacked shape) pairs,
// applied where the mesh has the dim (Megatron's tp splits, the experts over ep).
using Splits = std::vector<std::pair<std::string, int64_t>>;

// A stacked parameter [P V, shape...]: row s V + v (device s's virtual stage v) the initial
// value at `path` of layer blocks[row] for blocks[row] >= 0, zeros for -1; axis 0 over the pp
// dim (each device holds its V rows) and split further by `splits`.
Variable stacked_parameter(const StageContext& context, const std::vector<int64_t>& blocks, const std::string& path, const Splits& splits,
                           const InitialValue& initial) {
  const Mesh& mesh = context.mesh;
  const auto some = std::find_if(blocks.begin(), blocks.end(), [](int64_t block) { return block >= 0; });
  const Tensor first = initial(*some, path);  // a slot's module exists where some row holds its layer
  std::vector<int64_t> one = first.shape();
  one.insert(one.begin(), 1);
  std::vector<Tensor> entries;
  for (int64_t block : blocks)
    entries.push_back(reshape(block >= 0 ? initial(block, path) : zeros(first.shape(), Layout::replicated(mesh, first.rank())), one));
  Layout layout = stacked_layout(mesh, first.rank() + 1, -1, context.mesh_dim);
  for (const auto& [dim, axis] : splits)
    if (mesh.contains_dim(dim)) layout = layout.with_placement(mesh.dim_index(dim), Shard{axis});
  return Variable(with_layout(concat(entries, 0), layout));
}

// The tp split of a weight [P V, in, out] and its bias [P V, out] by output column, or none.
Splits tp_split(bool split, int64_t axis) { return split ? Splits{{"tp", axis}} : Splits{}; }

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
  const Tensor indices = stage_indices(context.mesh, context.mesh_dim, context.tick * p);  // this tick's own node
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
    const Tensor mask = stage_mask(indices, running, piece_shape);
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

// Megatron's splits on tp: by output column (a bias split alike) or by input row (a bias whole);
// None for a layer every tp rank runs whole (a MoE layer's shared experts, as the Transformer's
// tensor-parallel plan leaves them).
enum class TensorSplit { Column, Row, None };

// Linear / Dense (the Transformer's block_projection) for every stage: y[s] = x[s] @ weight[s]
// (+ bias[s]).
class StackedLinear : public Module {
 public:
  StackedLinear(std::shared_ptr<const StageContext> context, const std::vector<int64_t>& blocks, const InitialValue& initial,
                const std::string& path, bool bias, TensorSplit split)
      : context_(std::move(context)), split_(split), bias_(bias) {
    const Splits weight = split == TensorSplit::Column ? tp_split(true, 2) : tp_split(split == TensorSplit::Row, 1);
    register_parameter("weight", stacked_parameter(*context_, blocks, path + ".weight", weight, initial));
    if (bias) register_parameter("bias", stacked_parameter(*context_, blocks, path + ".bias", tp_split(split == TensorSplit::Column, 1), initial));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    Tensor x = inputs.at(0);  // [P, ..., in]
    const Mesh& mesh = context_->mesh;
    // Megatron's sequence parallelism: a column split (and a whole layer) reads every position,
    // gathered over tp.
    if (split_ != TensorSplit::Row && context_->sequence_parallel) x = with_layout(x, stacked_layout(mesh, x.rank(), 1, context_->mesh_dim));
    const std::vector<int64_t>& s = x.shape();
    int64_t rows = 1;
    for (size_t a = 1; a + 1 < s.size(); ++a) rows *= s[a];
    const Tensor weight = this_tick(parameter_value("weight"), *context_);
    Tensor y = reshape(matmul(reshape(x, {s.front(), rows, s.back()}), weight), [&] {
      std::vector<int64_t> shape = s;
      shape.back() = weight.shape()[2];
      return shape;
    }());
    if (bias_) y = y + per_stage(this_tick(parameter_value("bias"), *context_), x.rank());
    // Megatron's layouts, as ColwiseParallel and RowwiseParallel leave them: a column split's
    // output sharded by feature over tp, a row split's summed there once, right here (with
    // sequence parallelism, summed and split by position: a reduce_scatter).
    Layout out = split_ == TensorSplit::Row ? activation_layout(*context_, x.rank()) : stacked_layout(mesh, x.rank(), 1, context_->mesh_dim);
    if (split_ == TensorSplit::Column && mesh.contains_dim("tp")) out = out.with_placement(mesh.dim_index("tp"), Shard{x.rank() - 1});
    return {with_layout(y, out)};
  }

 private:
  std::shared_ptr<const StageContext> context_;
  TensorSplit split_;
  bool bias_;
};

// RMSNorm or LayerNorm (eps as configured) with each stage's weight (and bias).
class StackedNorm : public Module {
 public:
  StackedNorm(const TransformerConfig& c, std::shared_ptr<const StageContext> context, const std::vector<int64_t>& blocks,
              const InitialValue& initial, const std::string& path)
      : context_(std::move(context)), kind_(c.norm), eps_(c.norm_eps) {
    register_parameter("weight", stacked_parameter(*context_, blocks, path + ".weight", {}, initial));
    if (kind_ == NormKind::LayerNorm) register_parameter("bias", stacked_parameter(*context_, blocks, path + ".bias", {}, initial));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);
    const Tensor weight = per_stage(this_tick(parameter_value("weight"), *context_), x.rank());
    if (kind_ == NormKind::RMSNorm) return {rms_norm(x, std::nullopt, eps_) * weight};
    // layer_norm's own affine step, (normalised * weight) + bias, with each stage's weights.
    return {layer_norm(x, std::nullopt, std::nullopt, eps_) * weight + per_stage(this_tick(parameter_value("bias"), *context_), x.rank())};
  }

 private:
  std::shared_ptr<const StageContext> context_;
  NormKind kind_;
  double eps_;
};

class StackedAttention : public Module {
 public:
  StackedAttention(const TransformerConfig& c, const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks,
                   const InitialValue& initial)
      : context_(context), heads_(c.heads), kv_heads_(c.kv_heads) {
    auto linear = [&](const char* name, TensorSplit split) {
      return std::make_shared<StackedLinear>(context, blocks, initial, std::string("attention.") + name, c.bias, split);
    };
    for (const char* name : {"wq", "wk", "wv"}) register_module(name, linear(name, TensorSplit::Column));
    register_module("wo", linear("wo", TensorSplit::Row));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);  // [P, B, T, dim]
    const Tensor attended = causal_self_attention(get_submodule("wq")(x), get_submodule("wk")(x), get_submodule("wv")(x), heads_,
                                                  kv_heads_, context_->rotary);
    return {get_submodule("wo")(attended)};
  }

 private:
  std::shared_ptr<const StageContext> context_;
  int64_t heads_, kv_heads_;
};

// The dense MLP: SwiGLU w2(silu(w1 x) * w3 x), or GELU w2(gelu(w1 x)), at `path`
// ("feed_forward", or a MoE layer's "moe.shared_experts", which runs whole on every tp rank).
class StackedFeedForward : public Module {
 public:
  StackedFeedForward(MlpKind kind, bool bias, const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks,
                     const InitialValue& initial, const std::string& path, bool tensor_parallel)
      : kind_(kind) {
    auto linear = [&](const char* name, TensorSplit split) {
      return std::make_shared<StackedLinear>(context, blocks, initial, path + "." + name, bias, tensor_parallel ? split : TensorSplit::None);
    };
    register_module("w1", linear("w1", TensorSplit::Column));
    register_module("w2", linear("w2", TensorSplit::Row));
    if (kind_ == MlpKind::SwiGLU) register_module("w3", linear("w3", TensorSplit::Column));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);
    const Tensor up = get_submodule("w1")(x);
    const Tensor hidden = kind_ == MlpKind::SwiGLU ? silu(up) * get_submodule("w3")(x) : gelu(up, true);
    return {get_submodule("w2")(hidden)};
  }

 private:
  MlpKind kind_;
};

// Device s's mask [P, 1, ..., 1] (rank `rank`) this tick: selected[s].
Tensor per_device_mask(const StageContext& context, const std::vector<bool>& selected, int64_t rank) {
  std::vector<int64_t> shape(size_t(rank), 1);
  shape.front() = context.stages;
  return stage_mask(stage_indices(context.mesh, context.mesh_dim), selected, shape);
}

// The stacked routed experts: w1, w3 [P V, E, D, F] and w2 [P V, E, F, D], the experts' axis
// over ep (MoE::parallelize_experts's split).
class StackedExperts : public Module {
 public:
  StackedExperts(const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks, const InitialValue& initial) {
    for (const char* name : {"w1", "w2", "w3"})
      register_parameter(name, stacked_parameter(*context, blocks, std::string("moe.experts.") + name, {{"ep", 1}}, initial));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>&) override { throw Error("StackedExperts: StackedMoE runs them"); }
};

// A MoE layer (nn/moe.hpp) for every stage. The P stages' tokens go through one dispatch: each
// stage's routing picks among its own E experts, and routed_experts folds the stages into the
// token and expert axes (split over pp first), so every device dispatches its own stage's
// tokens to its own stage's experts, over ep where the mesh has it. The balancing loss of the
// stages that run this layer this tick enters the objective through its gradient
// (balancing_gradient).
class StackedMoE : public Module {
 public:
  StackedMoE(const TransformerConfig& c, const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks,
             const InitialValue& initial)
      : context_(context),
        moe_(c.moe.value()),
        dim_(c.dim),
        // The auxiliary-loss-free bias, a buffer (never a gradient's target): zeros, as MoE's starts.
        expert_bias_(zeros({int64_t(blocks.size()), moe_.num_experts}, stacked_layout(context->mesh, 2, -1, context->mesh_dim))) {
    register_parameter("router", stacked_parameter(*context, blocks, "moe.router", {}, initial));
    register_module("experts", std::make_shared<StackedExperts>(context, blocks, initial));
    if (moe_.num_shared_experts > 0)
      register_module("shared_experts", std::make_shared<StackedFeedForward>(MlpKind::SwiGLU, false, context, blocks, initial,
                                                                             "moe.shared_experts", false));
    for (int64_t block : blocks) runs_.push_back(block >= 0);
  }

  // The experts' loads of the traced loss's forward ticks, by stacked row, start again.
  void forget_load() { load_.reset(); }

  // MoE::update_expert_bias's rule, row by row (rows without a MoE layer have no load: unchanged).
  void update_expert_bias(double rate) {
    if (!load_) throw Error("PipelinedTransformer: update_expert_bias before any loss");
    const Tensor load = cast(*load_, DType::f32);
    const Tensor mean = reduce_mean(load, {1}, true);
    const Tensor direction = where(load < mean, 1.0, where(load > mean, -1.0, 0.0));
    expert_bias_.assign(expert_bias_.value() + rate * direction);
  }

  // The bias [E] of stacked row `row`.
  Tensor expert_bias(int64_t row) const {
    return reshape(slice(expert_bias_.value(), {row, 0}, {1, moe_.num_experts}), {moe_.num_experts});
  }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const StageContext& context = *context_;
    Tensor x = inputs.at(0);  // [P, B, T, D]
    // Whole tokens: with Megatron's sequence parallelism, gathered over tp first, the gradient
    // brought back to the sequence shards (as PrepareModuleInput places the Transformer's MoE input).
    if (context.sequence_parallel)
      x = x.redistribute(stacked_layout(context.mesh, x.rank(), 1, context.mesh_dim).placements(), x.layout().without_partial().placements());
    const std::vector<int64_t> shape = x.shape();
    int64_t n = 1;  // tokens a stage
    for (size_t a = 1; a + 1 < shape.size(); ++a) n *= shape[a];
    const int64_t p = shape[0], e = moe_.num_experts;
    const Tensor tokens = reshape(x, {p, n, dim_});
    const Tensor bias = reshape(this_tick(expert_bias_.value(), context), {p, 1, e});
    Routing routing = route_tokens(tokens, this_tick(parameter_value("router"), context), bias, moe_);
    // Devices that run no MoE layer here this tick (a dense layer's row, a chunk without this
    // slot, the bubble) dispatch nothing, and their balancing loss does not count.
    std::vector<bool> active(static_cast<size_t>(p));
    for (int64_t s = 0; s < p; ++s)
      active[size_t(s)] = context.busy[size_t(s)] && runs_[size_t(s * context.virtual_stages + context.virtual_stage[size_t(s)])];
    const Tensor running = cast(per_device_mask(context, active, 3), DType::i64);
    const Tensor kept = routing.kept ? *routing.kept * running : broadcast_to(running, routing.experts.shape());
    const Routing folded{reshape(routing.experts, {p * n, moe_.top_k}), reshape(routing.weights, {p * n, moe_.top_k}), routing.scores,
                         routing.load, reshape(kept, {p * n, moe_.top_k})};
    const Module& experts = get_submodule("experts");
    auto stacked_experts = [&](const char* name) {
      const Tensor w = this_tick(experts.parameter_value(name), context);  // [P, E, ...]
      return reshape(w, {p * e, w.shape()[2], w.shape()[3]});
    };
    const std::optional<std::string> ep_dim = context.mesh.contains_dim("ep") ? std::optional<std::string>("ep") : std::nullopt;
    Tensor y = reshape(routed_experts(reshape(tokens, {p * n, dim_}), folded, stacked_experts("w1"), stacked_experts("w2"),
                                      stacked_experts("w3"), moe_, ep_dim, context.mesh_dim, expert_capacity(moe_, n)),
                       x.shape());
    // The shared experts read `tokens` too, so that every use of x in this layer is one node: x's
    // gradient then adds this layer's terms as one, as on a mesh where x is first gathered over
    // tp (sequence parallelism), and the bits stay one device's.
    if (moe_.num_shared_experts > 0) y = y + reshape(get_submodule("shared_experts")(tokens), x.shape());
    if (context.tick < context.forward_ticks) record_load(routing.load, active);
    const Tensor aux = reduce_sum(balancing_loss(routing, moe_) * cast(per_device_mask(context, active, 1), DType::f32));
    return {balancing_gradient(with_layout(y, activation_layout(context, y.rank())), aux, context.aux_loss_scale)};
  }

 private:
  // y itself, whose backward also gives `aux` the adjoint `scale`: the balancing loss's term of
  // the objective, added where the layer runs (Megatron's MoEAuxLossAutoScaler).
  static Tensor balancing_gradient(const Tensor& y, const Tensor& aux, double scale) {
    auto rule = std::make_shared<GradientRule>();
    rule->inputs = {y.node(), aux.node()};
    rule->vjp = [scale](const NodeRef&, const std::vector<NodeRef>& in, const Tensor& g) {
      const Tensor a(in[1]);
      return std::vector<std::optional<Tensor>>{g, full(a.shape(), scale, a.layout().without_partial(), a.dtype())};
    };
    return with_gradient_rule(y, y.layout(), std::move(rule), SourceLocation::current());
  }

  // Adds this tick's loads [P, E] of the `active` devices to their rows s V + v ([P V, E]).
  void record_load(const Tensor& load, const std::vector<bool>& active) {
    const StageContext& context = *context_;
    const int64_t p = context.stages, v_count = context.virtual_stages, e = moe_.num_experts;
    const Tensor counted = load * cast(per_device_mask(context, active, 2), DType::i64);
    std::vector<Tensor> by_virtual_stage;  // [P, 1, E] each: device s's load where it runs v
    for (int64_t v = 0; v < v_count; ++v) {
      std::vector<bool> runs_v(static_cast<size_t>(p));
      for (int64_t s = 0; s < p; ++s) runs_v[size_t(s)] = context.virtual_stage[size_t(s)] == v;
      by_virtual_stage.push_back(reshape(counted * cast(per_device_mask(context, runs_v, 2), DType::i64), {p, 1, e}));
    }
    const Tensor rows = reshape(v_count == 1 ? by_virtual_stage.front() : concat(by_virtual_stage, 1), {p * v_count, e});
    load_ = load_ ? *load_ + rows : rows;
  }

  std::shared_ptr<const StageContext> context_;
  MoEConfig moe_;
  int64_t dim_;
  Variable expert_bias_;
  std::vector<bool> runs_;       // by stacked row: holds a MoE layer in this slot
  std::optional<Tensor> load_;   // i64 [P V, E]: the traced loss's forward ticks' loads
};

// One block position of every chunk: x [P, B, T, dim] -> [P, B, T, dim], device s with the
// weights of the virtual stage it runs this tick. Parameters are stacked [P V, ...], row s V + v;
// blocks[s V + v] is the layer device s's virtual stage v runs in this slot, or -1 for none.
class StackedTransformerBlock : public Module {
 public:
  StackedTransformerBlock(const TransformerConfig& c, const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks,
                          const InitialValue& initial)
      : context_(context), moe_rows_(blocks.size(), false) {
    // The rows whose layer has a dense MLP, and those whose layer is a mixture of experts (-1 in
    // the other's list); a slot holding both kinds selects per device.
    std::vector<int64_t> dense = blocks, moe = blocks;
    for (size_t row = 0; row < blocks.size(); ++row) {
      if (blocks[row] < 0) continue;
      moe_rows_[row] = c.is_moe_layer(blocks[row]);
      (moe_rows_[row] ? dense : moe)[row] = -1;
    }
    auto holds = [](const std::vector<int64_t>& rows) { return std::any_of(rows.begin(), rows.end(), [](int64_t b) { return b >= 0; }); };
    has_moe_ = holds(moe), has_dense_ = holds(dense);
    // TransformerBlock's registration order, so parameters() lists a slot's tensors in the order
    // the Transformer lists a block's.
    register_module("attention_norm", std::make_shared<StackedNorm>(c, context, blocks, initial, "attention_norm"));
    register_module("attention", std::make_shared<StackedAttention>(c, context, blocks, initial));
    register_module("ffn_norm", std::make_shared<StackedNorm>(c, context, blocks, initial, "ffn_norm"));
    if (has_moe_) register_module("moe", std::make_shared<StackedMoE>(c, context, moe, initial));
    if (has_dense_)
      register_module("feed_forward", std::make_shared<StackedFeedForward>(c.mlp, c.bias, context, dense, initial, "feed_forward", true));
  }

  // The slot's MoE layers (null where none of its rows has one).
  StackedMoE* moe() { return has_moe_ ? static_cast<StackedMoE*>(&get_submodule("moe")) : nullptr; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs.at(0);
    const Tensor h = x + get_submodule("attention")(get_submodule("attention_norm")(x));
    const Tensor z = get_submodule("ffn_norm")(h);
    if (!has_moe_) return {h + get_submodule("feed_forward")(z)};
    if (!has_dense_) return {h + get_submodule("moe")(z)};
    // Both kinds in this slot: each device keeps the one its layer has.
    const StageContext& context = *context_;
    std::vector<bool> moe(size_t(context.stages));
    for (int64_t s = 0; s < context.stages; ++s)
      moe[size_t(s)] = moe_rows_[size_t(s * context.virtual_stages + context.virtual_stage[size_t(s)])];
    const Tensor mask = stage_mask(stage_indices(context.mesh, context.mesh_dim), moe, z.shape());
    return {h + where(mask, get_submodule("moe")(z), get_submodule("feed_forward")(z))};
  }

 private:
  std::shared_ptr<const StageContext> context_;
  std::vector<bool> moe_rows_;  // by stacked row: the layer there is a mixture of experts
  bool has_moe_ = false, has_dense_ = false;
};

}  // namespace

PipelinedTransformer::PipelinedTransformer(const TransformerConfig& config, const Mesh& mesh, int64_t virtual_stages, std::string mesh_dim)
    : PipelinedTransformer(config, mesh, virtual_stages, std::move(mesh_dim), "PipelinedTransformer") {}

PipelinedTransformer::PipelinedTransformer(const TransformerConfig& config, const Mesh& mesh, int64_t virtual_stages, std::string mesh_dim,
                                           std::string who)
    : config_(checked_transformer_config(config)), who_(std::move(who)), context_(std::make_shared<StageContext>()) {
  const TransformerConfig& c = config_;
  if (virtual_stages < 1) throw Error(who_ + ": virtual stages must be positive, got " + std::to_string(virtual_stages));
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
  // The Transformer of this config gives the initial weights: its embeddings, norm and output
  // are this model's, its blocks' parameters the stacked entries. Same seeds, same values.
  const Transformer reference(c, mesh, who_);
  auto child = [&reference](const std::string& name) -> std::shared_ptr<Module> {
    for (const auto& [child_name, module] : reference.named_children())
      if (child_name == name) return module;
    return nullptr;
  };
  const InitialValue initial = [&reference](int64_t layer, const std::string& path) {
    return reference.get_parameter("layers." + std::to_string(layer) + "." + path).value();
  };
  tok_embeddings_ = register_module("tok_embeddings", child("tok_embeddings"));
  if (c.positions == PositionKind::Learned) pos_embeddings_ = register_module("pos_embeddings", child("pos_embeddings"));
  for (int64_t slot = 0; slot < chunk_blocks_.front(); ++slot) {
    std::vector<int64_t> blocks;  // by stacked row s V + v
    for (int64_t s = 0; s < p; ++s)
      for (int64_t v = 0; v < v_count; ++v) {
        const size_t chunk = size_t(v * p + s);
        blocks.push_back(slot < chunk_blocks_[chunk] ? first_block[chunk] + slot : -1);
      }
    slots_.push_back(register_module("slot" + std::to_string(slot), std::make_shared<StackedTransformerBlock>(c, context_, blocks, initial)));
  }
  norm_ = register_module("norm", child("norm"));
  if (!c.tied_embeddings) output_ = register_module("output", child("output"));
}

Tensor PipelinedTransformer::embed(const Tensor& ids) {
  if (ids.rank() != 2 || ids.shape()[1] > config_.max_seq)
    throw ShapeError(who_ + ": ids must be [batch, time] with time <= context " + std::to_string(config_.max_seq) + ", got " +
                     shape_string(ids.shape()));
  Tensor x = (*tok_embeddings_)(ids);
  if (pos_embeddings_) x = x + (*pos_embeddings_)(iota({ids.shape()[1]}, 0, Layout::replicated(ids.device_mesh(), 1)));
  return x;
}

Tensor PipelinedTransformer::stages_forward(const Tensor& stacked, int64_t tick, const std::vector<PipelineSlot>& slots) {
  context_->tick = tick;  // what the stacked layers select this tick
  std::vector<int64_t> virtual_stage;
  context_->busy.clear();
  for (const PipelineSlot& slot : slots) virtual_stage.push_back(slot.virtual_stage), context_->busy.push_back(slot.microbatch >= 0);
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

PipelineSpec PipelinedTransformer::spec(const Tensor& ids, int64_t microbatches) {
  if (!(ids.device_mesh() == context_->mesh))
    throw LayoutError(who_ + ": ids are on " + ids.device_mesh().to_string() + ", the model on " + context_->mesh.to_string());
  if (ids.rank() != 2) throw ShapeError(who_ + ": ids must be [batch, time], got " + shape_string(ids.shape()));
  // Every microbatch has the batch's length: one pair of rotary tables serves every tick.
  if (config_.positions == PositionKind::Rotary) context_->rotary = rotary_tables(config_, ids.shape()[1], context_->mesh);
  context_->forward_ticks = PipelineTimetable(context_->stages, context_->virtual_stages, microbatches).ticks();
  for (const auto& slot : slots_)
    if (StackedMoE* moe = static_cast<StackedTransformerBlock&>(*slot).moe()) moe->forget_load();
  PipelineSpec spec;
  spec.mesh_dim = context_->mesh_dim;
  spec.microbatches = microbatches;
  spec.virtual_stages = context_->virtual_stages;
  spec.first = [this, ids, microbatches](int64_t m) { return embed(microbatches == 1 ? ids : microbatch(ids, m, microbatches)); };
  spec.stages = [this](const Tensor& stacked, int64_t tick, const std::vector<PipelineSlot>& slots) {
    return stages_forward(stacked, tick, slots);
  };
  // Each microbatch's balancing losses weigh aux_loss_coefficient / M in the objective, the
  // loss being the microbatches' mean.
  context_->aux_loss_scale = config_.moe ? config_.moe->aux_loss_coefficient / double(microbatches) : 0;
  spec.state_layout = activation_layout(*context_, 4);
  return spec;
}

Tensor PipelinedTransformer::logits(const Tensor& last_output) {
  const Tensor x = (*norm_)(last_output);
  // Tied: the embedding table [vocab, dim] is the output projection's [dim, vocab] transposed.
  Tensor h = output_ ? (*output_)(x) : matmul(x, transpose(tok_embeddings_->parameter_value("weight")));
  // The policy's output dtype, as the hook apply_mixed_precision installs on a Transformer casts its logits.
  if (const auto& policy = mixed_precision()) h = cast(h, policy->output_dtype);
  return h;
}

std::vector<Tensor> PipelinedTransformer::run_stages(const Tensor& ids, int64_t microbatches) {
  std::vector<Tensor> outputs = run_pipeline(spec(ids, microbatches));
  for (Tensor& h : outputs) h = logits(h);
  return outputs;
}

std::vector<Tensor> PipelinedTransformer::forward(const std::vector<Tensor>& inputs) { return run_stages(inputs.at(0), 1); }

Tensor PipelinedTransformer::loss(const Tensor& ids, const Tensor& targets, int64_t microbatches) {
  const std::vector<Tensor> logits = run_stages(ids, microbatches);
  std::optional<Tensor> total;
  for (int64_t m = 0; m < microbatches; ++m) {
    const Tensor l = cross_entropy(logits[size_t(m)], microbatches == 1 ? targets : microbatch(targets, m, microbatches));
    total = total ? *total + l : l;
  }
  return microbatches == 1 ? *total : *total / double(microbatches);
}

std::pair<Tensor, std::vector<Tensor>> PipelinedTransformer::loss_and_gradients(const Tensor& ids, const Tensor& targets, int64_t microbatches,
                                                                               PipelineSchedule schedule) {
  const auto named = named_parameters();
  std::vector<Tensor> all;
  for (const auto& [name, p] : named) all.push_back(p);
  if (pipeline_schedule_loops(schedule) != (virtual_stages() > 1))
    throw Error(who_ + ": the " + pipeline_schedule_name(schedule) + " schedule with " + std::to_string(virtual_stages()) +
                " virtual stage(s) per device; looped-bfs and interleaved-1f1b run several, gpipe and 1f1b one");
  if (schedule == PipelineSchedule::GPipe || schedule == PipelineSchedule::LoopedBFS) {
    const Tensor l = loss(ids, targets, microbatches);
    return {l, gradients(l, all)};
  }
  PipelineLoss parts = parameter_parts();
  parts.loss = [&](const Tensor& last_output, int64_t m) {
    return cross_entropy(logits(last_output), microbatches == 1 ? targets : microbatch(targets, m, microbatches));
  };
  const PipelineGradients g = run_pipeline_1f1b(spec(ids, microbatches), parts);
  return {g.loss, joined_gradients(g)};
}

PipelineLoss PipelinedTransformer::parameter_parts() const {
  // The embeddings feed stage 0, the slots are the stages, the norm and the output follow. A
  // tied embedding table is also the output's: its gradient is both parts' sum.
  PipelineLoss parts;
  for (const auto& [name, p] : named_parameters())
    (name.rfind("slot", 0) == 0 ? parts.stage_parameters : parts.stage_parameters.empty() ? parts.first_parameters : parts.last_parameters)
        .push_back(p);
  if (config_.tied_embeddings) parts.last_parameters.push_back(tok_embeddings_->get_parameter("weight"));
  return parts;
}

std::vector<Tensor> PipelinedTransformer::joined_gradients(const PipelineGradients& parts) const {
  std::vector<Tensor> grads = parts.first;
  if (config_.tied_embeddings) grads.front() = grads.front() + parts.last.back();  // tok_embeddings.weight is listed first
  grads.insert(grads.end(), parts.stages.begin(), parts.stages.end());
  grads.insert(grads.end(), parts.last.begin(), parts.last.end() - (config_.tied_embeddings ? 1 : 0));
  return grads;
}

PipelineTickModel PipelinedTransformer::tick_model(const Tensor& ids, const Tensor& targets, int64_t microbatches) {
  if (virtual_stages() > 1)
    throw Error(who_ + ": 1F1B's host loop runs one virtual stage per device; this model has " + std::to_string(virtual_stages()));
  if (config_.moe) throw Error(who_ + ": 1F1B's host loop does not run MoE layers (their balancing weighs the stages busy at a tick)");
  const PipelineSpec pipeline = spec(ids, microbatches);
  const PipelineLoss parts = parameter_parts();
  PipelineTickModel model;
  model.mesh_dim = pipeline.mesh_dim;
  model.state_layout = pipeline.state_layout;
  model.first = [this, ids, microbatches](const Tensor& index) { return embed(microbatch(ids, index, microbatches)); };
  // Every stage runs its blocks (one virtual stage each); the loop masks the idle ones' values.
  model.stages = [this](const Tensor& stacked, int64_t tick) {
    return stages_forward(stacked, tick, std::vector<PipelineSlot>(size_t(context_->stages), PipelineSlot{0, 0}));
  };
  model.loss = [this, targets, microbatches](const Tensor& last_output, const Tensor& index) {
    return cross_entropy(logits(last_output), microbatch(targets, index, microbatches));
  };
  model.first_parameters = parts.first_parameters;
  model.stage_parameters = parts.stage_parameters;
  model.last_parameters = parts.last_parameters;
  return model;
}

std::vector<Tensor> PipelinedTransformer::gradient_squares(const std::vector<Tensor>& grads) const {
  const auto named = named_parameters();
  if (grads.size() != named.size())
    throw Error(who_ + "::gradient_squares: " + std::to_string(grads.size()) + " gradients for " + std::to_string(named.size()) +
                " parameters");
  auto squares = [](const Tensor& g, std::vector<int64_t> axes) { return reduce_sum(square(cast(g, DType::f64)), axes, false); };
  const int64_t rows = context_->stages * context_->virtual_stages;
  std::vector<Tensor> before, after;  // the embeddings; the norm and the output
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
  // block's parameters in the Transformer's order: chunk by chunk, block by block.
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

int64_t PipelinedTransformer::stages() const { return context_->stages; }
int64_t PipelinedTransformer::virtual_stages() const { return context_->virtual_stages; }

void PipelinedTransformer::update_expert_bias(double rate) {
  bool any = false;
  for (const auto& slot : slots_)
    if (StackedMoE* moe = static_cast<StackedTransformerBlock&>(*slot).moe()) moe->update_expert_bias(rate), any = true;
  if (!any) throw Error(who_ + ": update_expert_bias of a model without MoE layers");
}

Tensor PipelinedTransformer::expert_bias(int64_t layer) const {
  if (layer < 0 || layer >= config_.layers || !config_.is_moe_layer(layer))
    throw Error(who_ + ": layer " + std::to_string(layer) + " is no MoE layer");
  // Chunk v P + s holds layers first_block .. + its count; layer `layer` sits in slot layer - first.
  const int64_t p = context_->stages;
  int64_t first = 0;
  for (size_t chunk = 0; chunk < chunk_blocks_.size(); ++chunk) {
    if (layer < first + chunk_blocks_[chunk]) {
      const int64_t s = int64_t(chunk) % p, v = int64_t(chunk) / p;
      auto& block = static_cast<StackedTransformerBlock&>(*slots_[size_t(layer - first)]);
      return block.moe()->expert_bias(s * context_->virtual_stages + v);
    }
    first += chunk_blocks_[chunk];
  }
  throw Error(who_ + ": layer " + std::to_string(layer) + " is in no chunk");
}

void PipelinedTransformer::use_sequence_parallelism() {
  if (!context_->mesh.contains_dim("tp"))
    throw Error("sequence parallelism shards the sequence over the tp mesh dim; the mesh " + context_->mesh.to_string() + " has none");
  context_->sequence_parallel = true;
}

void distribute_pipelined_transformer(PipelinedTransformer& model, const Mesh& mesh, bool fsdp, bool sequence_parallel) {
  if (fsdp && !mesh.contains_dim("dp")) throw Error("fsdp shards parameters over the dp mesh dim; the mesh " + mesh.to_string() + " has none");
  if (sequence_parallel) model.use_sequence_parallelism();
  const std::optional<MixedPrecisionPolicy>& policy = model.transformer_config().mixed_precision;
  if (fsdp) fully_shard(model, mesh, policy.value_or(MixedPrecisionPolicy{}), "dp");
  else if (policy) apply_mixed_precision(model, *policy);
}

}  // namespace tessera
