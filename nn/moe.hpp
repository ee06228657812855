// A dropless mixture of experts (torchtitan's MoE; DeepSeek-V3's and Mixtral's layers): a
// token-choice top-k router, routed experts stored stacked ([E, D, F] weights, SwiGLU each), and
// optional shared experts run on every token. Dropless: every token reaches its k experts;
// tokens are ordered by expert and each expert's GEMM runs on exactly its rows
// (grouped_matmul with run-time group sizes), so no capacity is padded and no token dropped.
// MoEConfig::capacity_factor gives the capacity-factor mode instead, which drops what an expert
// receives past its capacity (the same assignments on every layout).
//
// With an "ep" mesh dim (expert parallelism, torchtitan's dp2ep: ep shards the tokens as a
// data-parallel dim does and the experts over their first axis), each device sends its tokens'
// rows to the devices owning their experts with all_to_all_v and gets the results back the same
// way. The routing runs on global tensors before the dispatch, so its sums (the router's
// gradient) take the partitioner's deterministic order: under TESSERA_DETERMINISTIC=1 losses are
// bitwise the same for every ep.
//
// Parameters (torchtitan's names): router.weight [D, E], experts.w1 / w3 [E, D, F] and
// experts.w2 [E, F, D], shared_experts.{w1, w2, w3} (a FeedForward of num_shared x F).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsl/mesh.hpp"
#include "dsl/variable.hpp"
#include "nn/module.hpp"
#include "nn/transformer_config.hpp"

namespace tessera {

// The stacked routed experts: for rows ordered by expert, rows of expert e (group_sizes[e] of
// them, in order) go through expert e's SwiGLU: w2[e](silu(w1[e] x) * w3[e] x).
class GroupedExperts : public Module {
 public:
  GroupedExperts(int64_t num_experts, int64_t dim, int64_t hidden, const Mesh& mesh, uint64_t seed);
  // inputs: rows [R, D], group_sizes i64 [E] -> [R, D] (rows past the groups' total: zero).
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  // The same on given (local) weights: what forward and the expert-parallel dispatch run.
  static Tensor apply(const Tensor& rows, const Tensor& group_sizes, const Tensor& w1, const Tensor& w2, const Tensor& w3);
};

// What the router decided for one forward: each token's k experts and their weights.
struct Routing {
  Tensor experts;  // i64 [N, k], the top-k by score (+ expert_bias), ties to the lower index
  Tensor weights;  // [N, k], the chosen experts' scores (normalised to sum 1 if asked)
  Tensor scores;   // [N, E], softmax or sigmoid of the router's logits
  Tensor load;     // i64 [E], tokens each expert received
  // Capacity-factor mode (MoEConfig::capacity_factor): i64 [N, k], 1 for the assignments that
  // run, 0 for those dropped past their expert's capacity. Empty when dropless.
  std::optional<Tensor> kept;
};

// The router's decision for tokens [..., N, D] (leading axes: separate groups, a pipeline's
// stages) with `router` [..., D, E] and `bias` broadcasting against the scores [..., N, E]:
// Routing's fields with the same leading axes (load [..., E]; kept in capacity-factor mode, each
// group's capacity from its own N).
Routing route_tokens(const Tensor& tokens, const Tensor& router, const Tensor& bias, const MoEConfig& config);

// Switch Transformer's balancing loss, E * sum_e f_e * P_e, from `routing` over N tokens: [...]
// per leading group (a scalar without one).
Tensor balancing_loss(const Routing& routing, const MoEConfig& config);

// Capacity-factor mode's bound: the assignments each expert runs at most in a forward of
// `tokens` tokens, ceil(capacity_factor * tokens * top_k / num_experts).
int64_t expert_capacity(const MoEConfig& config, int64_t tokens);

// The routed experts' output [N, D] for tokens [N, D] routed by `routing` (experts, weights and
// kept [N, k]): rows ordered by expert, each expert's SwiGLU with w1 / w3 [E, D, F] and w2
// [E, F, D] on exactly its rows, dispatched over `ep_dim` with all_to_all_v where given.
// `stage_dim`: a pipeline's stacked stages, each with experts of its own. The tokens are then
// the S stages' N / S each, back to back, and the weights [S E, ...], both split over it first;
// expert ids stay within each stage's E. `capacity`: capacity-factor mode's per-expert bound
// (each stage's), 0 when dropless.
Tensor routed_experts(const Tensor& tokens, const Routing& routing, const Tensor& w1, const Tensor& w2, const Tensor& w3,
                      const MoEConfig& config, const std::optional<std::string>& ep_dim, const std::optional<std::string>& stage_dim,
                      int64_t capacity);

class MoE : public Module {
 public:
  // config.moe says the experts; dim is config.dim. Parameters start replicated on `mesh`.
  MoE(const TransformerConfig& config, const Mesh& mesh, uint64_t seed);
  // x [..., D] -> [..., D].
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

  // The router alone on tokens [N, D].
  Routing route(const Tensor& tokens) const;
  // The last forward's load-balancing loss (Switch Transformer's and torchtitan's:
  // E * sum_e f_e * P_e, f_e the share of assignments to expert e, P_e its mean score); 1 when
  // the load is uniform. Add aux_loss_coefficient * it to the training loss. Error before forward.
  const Tensor& aux_loss() const;
  // The last forward's tokens per expert (i64 [E]). Error before forward.
  const Tensor& expert_load() const;
  // DeepSeek-V3's auxiliary-loss-free balancing: expert_bias += rate * sign(mean load - load),
  // from the last forward's load. The bias shifts which experts are chosen, never their weights.
  // Inside a jit'd step it is an assignment like an optimizer's.
  void update_expert_bias(double rate);
  Variable expert_bias() const { return expert_bias_; }

  // Expert parallelism over `mesh_dim`: experts.w1/w2/w3 sharded over their first axis there
  // (Error unless its size divides num_experts), tokens dispatched by all_to_all_v.
  void parallelize_experts(const Mesh& mesh, const std::string& mesh_dim = "ep");
  const std::optional<std::string>& expert_parallel_dim() const { return ep_dim_; }
  // Capacity-factor mode: expert_capacity(config, tokens) of this layer's config.
  int64_t expert_capacity(int64_t tokens) const { return tessera::expert_capacity(moe_, tokens); }

 private:
  MoEConfig moe_;
  int64_t dim_;
  Variable expert_bias_;  // a buffer: not a parameter, never a gradient's target
  std::optional<std::string> ep_dim_;
  std::optional<Tensor> aux_loss_, load_;
};

}  // namespace tessera
