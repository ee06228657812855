#include "nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "dsl/activations.hpp"
#include "dsl/determinism.hpp"
#include "dsl/error.hpp"
#include "dsl/grouped_matmul.hpp"
#include "dsl/indexing.hpp"
#include "dsl/local_map.hpp"
#include "dsl/ops.hpp"
#include "dsl/sorting.hpp"
#include "dsl/string_util.hpp"
#include "nn/transformer.hpp"

namespace tessera {
namespace {

Variable uniform_parameter(std::vector<int64_t> shape, double bound, const Mesh& mesh, uint64_t seed) {
  const int64_t rank = int64_t(shape.size());
  return Variable(random_uniform(std::move(shape), seed, Layout::replicated(mesh, rank), -bound, bound));
}

// Exclusive running sum along axis 0 of a 1-D integer tensor: where each block starts.
Tensor block_starts(const Tensor& sizes) { return cumsum(sizes, 0) - sizes; }

// For each row r of `row_index` (0 .. R-1): the block of `sizes` (blocks laid end to end) it
// falls in, clamped to the last block for rows past them all.
Tensor block_of_row(const Tensor& row_index, const Tensor& sizes) {
  const int64_t blocks = sizes.shape()[0];
  const Tensor ends = cumsum(sizes, 0);
  const Tensor passed = reduce_sum(cast(expand_dims(ends, 0) <= expand_dims(row_index, 1), DType::i64), {1});
  return minimum(passed, int64_t(blocks - 1));
}

// Local to one device (inside local_map, or the whole batch on one device): tokens [n, D], each
// with k chosen experts and weights; w1/w2/w3 this device's experts (all of them without
// expert parallelism). Returns [n, D]: each token's weighted sum of its experts' outputs.
//
// Assignments (token, slot) are ordered by expert with a counting sort: an assignment's place is
// its expert's start plus the number of earlier assignments to that expert, so ties keep token
// order and every layout orders an expert's rows alike. Under expert parallelism the ordered
// rows go to the devices owning their experts (all_to_all_v), arrive grouped by source, are
// regrouped by expert for the grouped GEMMs, and return the same way.
Tensor routed_output(const Tensor& tokens, const Tensor& chosen, const Tensor& weights, const std::optional<Tensor>& kept, const Tensor& w1,
                     const Tensor& w2, const Tensor& w3, const Tensor& row_index, int64_t num_experts,
                     const std::optional<std::string>& ep_dim, int64_t ep) {
  const int64_t n = tokens.shape()[0], d = tokens.shape()[1], k = chosen.shape()[1], m = n * k;
  const Tensor expert = reshape(chosen, {m});
  Tensor hits = one_hot(expert, num_experts, DType::i64);                         // [M, E]
  // Capacity-factor mode: a dropped assignment is in no expert's group and goes to row M, past
  // the end (it adds nothing and reads zeros).
  const std::optional<Tensor> runs = kept ? std::optional<Tensor>(reshape(*kept, {m})) : std::nullopt;
  if (runs) hits = hits * expand_dims(*runs, 1);
  const Tensor load = reduce_sum(hits, {0});                                       // [E]
  const Tensor earlier = reduce_sum(hits * (cumsum(hits, 0) - hits), {1});         // [M]
  Tensor place = gather(block_starts(load), expert, 0) + earlier;                 // [M]
  if (runs) place = where(*runs != int64_t(0), place, int64_t(m));
  const Tensor rows = reshape(broadcast_to(expand_dims(tokens, 1), {n, k, d}), {m, d});
  const Tensor ordered = detail::scatter_add_rows(rows, place, m, Loc::current());                 // [M, D] by expert
  Tensor out;
  if (!ep_dim) {
    out = GroupedExperts::apply(ordered, load, w1, w2, w3);
  } else {
    // The rows this device's experts may receive: row_index's length (MoEConfig::receive_capacity).
    const int64_t local_experts = num_experts / ep, bound = row_index.shape()[0];
    const Tensor per_device = reshape(load, {ep, local_experts});
    const auto [received, received_counts] = all_to_all_v(ordered, reduce_sum(per_device, {1}), *ep_dim, bound);  // [bound, D]
    // Row j of per_device goes to device j: by_source[s El + e] = rows source s sent to this
    // device's expert e, blocks laid out (s, e) as they arrive.
    const Tensor by_source = reshape(all_to_all(per_device, *ep_dim, 0, 1), {ep * local_experts});
    const Tensor from = reshape(by_source, {ep, local_experts});
    const Tensor by_expert_starts = reshape(transpose(reshape(block_starts(reshape(transpose(from), {local_experts * ep})),
                                                              {local_experts, ep})),
                                            {ep * local_experts});                             // (s, e) -> start of (e, s)
    const Tensor block = block_of_row(row_index, by_source);
    const Tensor within = row_index - gather(block_starts(by_source), block, 0);
    const Tensor total = reduce_sum(by_source, {0});
    // Rows past what arrived go nowhere (an index past the end adds nothing and reads zeros).
    const Tensor regroup = where(row_index < total, gather(by_expert_starts, block, 0) + within, int64_t(bound));
    const Tensor expert_rows = detail::scatter_add_rows(received, regroup, bound, Loc::current());
    const Tensor results = GroupedExperts::apply(expert_rows, reduce_sum(from, {0}), w1, w2, w3);
    const Tensor back = detail::take_rows(results, regroup, Loc::current());                                   // by source again
    out = all_to_all_v(back, received_counts, *ep_dim, m).first;                              // [M, D] by expert
  }
  const Tensor per_assignment = reshape(detail::take_rows(out, place, Loc::current()), {n, k, d});
  return reduce_sum(per_assignment * expand_dims(cast(weights, tokens.dtype()), -1), {1});
}

// Capacity-factor mode's choice on the global routing, chosen [..., N, k] -> i64 [..., N, k]: 1
// for the assignments within their expert's `capacity`, first choices before second ones
// (slot-major), each in token order; each leading group on its own.
Tensor within_capacity(const Tensor& chosen, int64_t num_experts, int64_t capacity) {
  const int64_t r = chosen.rank(), n = chosen.shape()[size_t(r - 2)], k = chosen.shape()[size_t(r - 1)];
  const std::vector<int64_t> shape = chosen.shape();
  std::vector<int64_t> flat(shape.begin(), shape.end() - 2), grid = flat;
  flat.insert(flat.end(), {k * n, num_experts});
  grid.insert(grid.end(), {k, n});
  const Tensor hits = reshape(one_hot(detail::transpose_last_two(chosen, Loc::current()), num_experts, DType::i64), flat);  // [..., k N, E]
  const Tensor position = reduce_sum(hits * (cumsum(hits, r - 2) - hits), {r - 1});                               // [..., k N]
  return detail::transpose_last_two(reshape(cast(position < capacity, DType::i64), grid), Loc::current());
}

}  // namespace

GroupedExperts::GroupedExperts(int64_t num_experts, int64_t dim, int64_t hidden, const Mesh& mesh, uint64_t seed) {
  // PyTorch's Linear bounds per expert: 1 / sqrt(fan_in).
  register_parameter("w1", uniform_parameter({num_experts, dim, hidden}, 1 / std::sqrt(double(dim)), mesh, seed));
  register_parameter("w2", uniform_parameter({num_experts, hidden, dim}, 1 / std::sqrt(double(hidden)), mesh, seed + 1));
  register_parameter("w3", uniform_parameter({num_experts, dim, hidden}, 1 / std::sqrt(double(dim)), mesh, seed + 2));
}

Tensor GroupedExperts::apply(const Tensor& rows, const Tensor& group_sizes, const Tensor& w1, const Tensor& w2, const Tensor& w3) {
  const Tensor gated = silu(grouped_matmul(rows, w1, group_sizes)) * grouped_matmul(rows, w3, group_sizes);
  return grouped_matmul(gated, w2, group_sizes);
}

std::vector<Tensor> GroupedExperts::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() != 2) throw Error("GroupedExperts: forward takes rows and group_sizes, got " + std::to_string(inputs.size()) + " inputs");
  return {apply(inputs[0], inputs[1], parameter_value("w1"), parameter_value("w2"), parameter_value("w3"))};
}

MoE::MoE(const TransformerConfig& config, const Mesh& mesh, uint64_t seed)
    : moe_(checked_transformer_config(config).moe.value_or(MoEConfig{})),
      dim_(config.dim),
      expert_bias_(zeros({moe_.num_experts}, Layout::replicated(mesh, 1), DType::f32)) {
  if (!config.moe) throw Error("MoE: the TransformerConfig '" + config.name + "' has no moe section");
  register_parameter("router", uniform_parameter({dim_, moe_.num_experts}, 1 / std::sqrt(double(dim_)), mesh, seed));
  register_module("experts", std::make_shared<GroupedExperts>(moe_.num_experts, dim_, moe_.expert_hidden, mesh, seed + 10));
  if (moe_.num_shared_experts > 0) {
    TransformerConfig shared = config;
    shared.mlp = MlpKind::SwiGLU, shared.bias = false;
    register_module("shared_experts", std::make_shared<FeedForward>(shared, moe_.num_shared_experts * moe_.expert_hidden, mesh, seed + 20));
  }
}

Routing route_tokens(const Tensor& tokens, const Tensor& router, const Tensor& bias, const MoEConfig& m) {
  const Tensor logits = matmul(cast(tokens, DType::f32), cast(router, DType::f32));
  const int64_t last = logits.rank() - 1;
  Routing r;
  r.scores = m.score == RouterScore::Softmax ? softmax(logits, -1) : sigmoid(logits);
  // The bias (auxiliary-loss-free balancing) only chooses; topk breaks ties by the lower index.
  r.experts = topk(stop_gradient(r.scores + bias), m.top_k, -1).second;
  r.weights = take_along_axis(r.scores, r.experts, last);
  if (m.normalize_top_k) r.weights = r.weights / reduce_sum(r.weights, {last}, true);
  r.load = reduce_sum(one_hot(r.experts, m.num_experts, DType::i64), {last - 1, last});
  if (m.capacity_factor > 0) r.kept = within_capacity(r.experts, m.num_experts, expert_capacity(m, tokens.shape()[size_t(last - 1)]));
  return r;
}

Tensor balancing_loss(const Routing& routing, const MoEConfig& m) {
  const int64_t last = routing.scores.rank() - 1, n = routing.scores.shape()[size_t(last - 1)];
  // E * sum_e (share of assignments to e) * (mean score of e).
  const Tensor share = cast(routing.load, DType::f32) / double(n * m.top_k);
  return double(m.num_experts) * reduce_sum(share * reduce_mean(routing.scores, {last - 1}), {last - 1});
}

int64_t expert_capacity(const MoEConfig& m, int64_t tokens) {
  return int64_t(std::ceil(m.capacity_factor * double(tokens * m.top_k) / double(m.num_experts)));
}

Tensor routed_experts(const Tensor& tokens, const Routing& routing, const Tensor& w1, const Tensor& w2, const Tensor& w3, const MoEConfig& m,
                      const std::optional<std::string>& ep_dim, const std::optional<std::string>& stage_dim, int64_t capacity) {
  const Mesh mesh = tokens.device_mesh();
  const int64_t n = tokens.shape()[0], e = m.num_experts;
  const int64_t ep = ep_dim ? mesh.dim_size(*ep_dim) : 1;
  const int64_t stages = stage_dim && mesh.contains_dim(*stage_dim) ? mesh.dim_size(*stage_dim) : 1;
  // A device's tokens and experts must be one stage's: the stage dim splits both first.
  if (stages > 1)
    for (const char* dim : {"dp", "ep"})
      if (mesh.contains_dim(dim) && mesh.dim_index(dim) < mesh.dim_index(*stage_dim))
        throw Error("MoE in pipeline stages: the mesh " + mesh.to_string() + " lists " + dim + " before " + *stage_dim +
                    "; list the stage dim first");
  // Each device dispatches as many tokens: a stage's tokens that do not split evenly over ep
  // are padded with rows that dispatch nothing (kept 0), and the output sliced back.
  const int64_t per_stage = n / stages, padded = (per_stage + ep - 1) / ep * ep;
  if (padded != per_stage) {
    auto pad_rows = [&](const Tensor& t) {
      const int64_t width = t.shape()[1];
      return reshape(pad(reshape(t, {stages, per_stage, width}), {{0, 0}, {0, padded - per_stage}, {0, 0}}), {stages * padded, width});
    };
    Routing even = routing;
    even.experts = pad_rows(routing.experts), even.weights = pad_rows(routing.weights);
    even.kept = pad_rows(routing.kept ? *routing.kept : ones(routing.experts.shape(), routing.experts.layout(), DType::i64));
    const int64_t d = tokens.shape()[1];
    const Tensor y = routed_experts(pad_rows(tokens), even, w1, w2, w3, m, ep_dim, stage_dim, capacity);
    return reshape(slice(reshape(y, {stages, padded, d}), {0, 0, 0}, {stages, per_stage, d}), {n, d});
  }
  // Tokens stay on their data-parallel shards (dp, and ep, which borrows data-parallel ranks);
  // the experts' weights are sharded over ep. Under TESSERA_DETERMINISTIC=1 the tokens are
  // gathered over dp instead: experts replicated over dp would get their gradient as a sum of
  // per-replica partial sums, an order no other mesh has, while with every token of the ep group
  // each expert sums its rows in token order on every mesh (dp's devices repeat the work).
  // Uneven dp shards are gathered too: the dispatch merges each device's token and slot axes,
  // which one program can only do where every device holds as many tokens.
  const int64_t dp = mesh.contains_dim("dp") ? mesh.dim_size("dp") : 1;
  const bool tokens_over_dp = !deterministic_mode() && n % (stages * dp * ep) == 0;
  std::vector<Placement> token_placements(size_t(mesh.ndim()), Replicate{}), expert_placements = token_placements;
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    const std::string& name = mesh.dim_names()[size_t(d)];
    const bool stage = stages > 1 && name == *stage_dim, expert = ep_dim && name == *ep_dim;
    if ((name == "dp" && tokens_over_dp) || expert || stage) token_placements[size_t(d)] = Shard{0};
    if (expert || stage) expert_placements[size_t(d)] = Shard{0};
  }
  int64_t token_shards = 1;
  for (int64_t d = 0; d < mesh.ndim(); ++d)
    if (std::holds_alternative<Shard>(token_placements[size_t(d)])) token_shards *= mesh.shape()[size_t(d)];
  // Rows one device may receive: every assignment of the largest token shard from each ep peer,
  // or the receive capacity's multiple of one shard's assignments.
  const int64_t largest_shard = (n + token_shards - 1) / token_shards;
  const int64_t assignments = largest_shard * m.top_k;
  int64_t bound = assignments * ep;
  if (m.receive_capacity > 0) bound = std::min(bound, int64_t(std::ceil(m.receive_capacity * double(assignments))));
  // With a capacity factor no expert runs more than its capacity's rows, wherever they come from.
  if (m.capacity_factor > 0) bound = std::min(bound, capacity * (e / ep));
  const Tensor row_index = iota({bound}, 0, Layout::replicated(mesh, 1), DType::i64);
  const std::vector<Placement> replicated(size_t(mesh.ndim()), Replicate{});
  if (routing.kept) {
    auto local = local_map(
        [e, ep, ep_dim](const Tensor& t, const Tensor& chosen, const Tensor& weights, const Tensor& kept, const Tensor& w1,
                        const Tensor& w2, const Tensor& w3, const Tensor& rows) {
          return routed_output(t, chosen, weights, kept, w1, w2, w3, rows, e, ep_dim, ep);
        },
        {token_placements},
        {token_placements, token_placements, token_placements, token_placements, expert_placements, expert_placements, expert_placements,
         replicated},
        mesh, /*redistribute_inputs=*/true);
    return local(tokens, routing.experts, routing.weights, *routing.kept, w1, w2, w3, row_index);
  }
  auto local = local_map(
      [e, ep, ep_dim](const Tensor& t, const Tensor& chosen, const Tensor& weights, const Tensor& w1, const Tensor& w2, const Tensor& w3,
                      const Tensor& rows) { return routed_output(t, chosen, weights, std::nullopt, w1, w2, w3, rows, e, ep_dim, ep); },
      {token_placements},
      {token_placements, token_placements, token_placements, expert_placements, expert_placements, expert_placements, replicated}, mesh,
      /*redistribute_inputs=*/true);
  return local(tokens, routing.experts, routing.weights, w1, w2, w3, row_index);
}

Routing MoE::route(const Tensor& tokens) const {
  if (tokens.rank() != 2 || tokens.shape()[1] != dim_)
    throw ShapeError("MoE: tokens must be [N, " + std::to_string(dim_) + "], got " + shape_string(tokens.shape()));
  return route_tokens(tokens, parameter_value("router"), expert_bias_.value(), moe_);
}

std::vector<Tensor> MoE::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() != 1) throw Error("MoE: forward takes one input, got " + std::to_string(inputs.size()));
  const Tensor& x = inputs[0];
  if (x.rank() < 1 || x.shape().back() != dim_)
    throw ShapeError("MoE: the input's last axis must be dim " + std::to_string(dim_) + ", got " + shape_string(x.shape()));
  int64_t n = 1;
  for (size_t a = 0; a + 1 < x.shape().size(); ++a) n *= x.shape()[a];
  const Tensor tokens = reshape(x, {n, dim_});
  const Routing routing = route(tokens);
  aux_loss_ = balancing_loss(routing, moe_);
  load_ = routing.load;
  const Module& experts = get_submodule("experts");
  Tensor y = routed_experts(tokens, routing, experts.parameter_value("w1"), experts.parameter_value("w2"), experts.parameter_value("w3"),
                            moe_, ep_dim_, std::nullopt, expert_capacity(n));
  if (moe_.num_shared_experts > 0) y = y + get_submodule("shared_experts")(tokens);
  return {reshape(y, x.shape())};
}

const Tensor& MoE::aux_loss() const {
  if (!aux_loss_) throw Error("MoE: aux_loss() before any forward");
  return *aux_loss_;
}

const Tensor& MoE::expert_load() const {
  if (!load_) throw Error("MoE: expert_load() before any forward");
  return *load_;
}

void MoE::update_expert_bias(double rate) {
  const Tensor load = cast(expert_load(), DType::f32);
  const Tensor mean = reduce_mean(load, {}, true);
  const Tensor direction = where(load < mean, 1.0, where(load > mean, -1.0, 0.0));
  expert_bias_.assign(expert_bias_.value() + rate * direction);
}

void MoE::parallelize_experts(const Mesh& mesh, const std::string& mesh_dim) {
  if (!mesh.contains_dim(mesh_dim)) throw Error("MoE: expert parallelism over '" + mesh_dim + "', which the mesh " + mesh.to_string() + " lacks");
  const int64_t ep = mesh.dim_size(mesh_dim);
  if (moe_.num_experts % ep != 0)
    throw ShapeError("MoE: " + std::to_string(moe_.num_experts) + " experts do not split evenly over " + mesh_dim + "=" + std::to_string(ep));
  Module& experts = get_submodule("experts");
  for (const char* name : {"w1", "w2", "w3"}) {
    const Variable current = experts.get_parameter(name);
    std::vector<Placement> placements = current.value().placements();
    placements[size_t(mesh.dim_index(mesh_dim))] = Shard{0};
    experts.set_parameter(name, Variable(current.value().redistribute(mesh, placements)));
  }
  ep_dim_ = mesh_dim;
}

}  // namespace tessera
