#include "nn/parallel_styles.hpp"

#include "dsl/determinism.hpp"
#include "dsl/error.hpp"
#include "dsl/ops.hpp"

namespace tessera {
namespace {

int64_t mesh_dim_named(const Mesh& mesh, std::string& name, bool last, const char* who) {
  if (name.empty()) name = mesh.dim_names()[last ? size_t(mesh.ndim() - 1) : 0];
  if (!mesh.contains_dim(name)) throw MeshError(std::string(who) + ": unknown mesh dim '" + name + "' of mesh " + mesh.to_string());
  return mesh.dim_index(name);
}

// Shard(-1) and the like against a tensor of `rank`.
Placement resolved(Placement p, int64_t rank) {
  if (auto* s = std::get_if<Shard>(&p); s && s->dim < 0) s->dim += rank;
  return p;
}

// `t` with placement `p` on mesh dim `d` and its placements elsewhere kept.
Tensor placed(const Tensor& t, int64_t d, const Placement& p) {
  std::vector<Placement> placements = t.placements();
  placements[size_t(d)] = resolved(p, t.rank());
  return placements == t.placements() ? t : t.redistribute(placements);
}

// An activation placed as `placed` does, its gradient brought back to t's placements (a partial
// one replicated), as PyTorch's redistribute backward does: a sequence-parallel layer norm's
// output gradient is then reduce_scattered to its sequence shards (Megatron's sequence
// parallelism), rather than the norm's backward run whole on every device, on the gradient's
// unsummed full-length terms, which the norm's weight gradient would hold until it ran.
Tensor placed_activation(const Tensor& t, int64_t d, const Placement& p) {
  std::vector<Placement> placements = t.placements();
  placements[size_t(d)] = resolved(p, t.rank());
  if (placements == t.placements()) return t;
  return t.redistribute(placements, t.layout().without_partial().placements());
}

// Moves the module's own parameter `name` (if it has one) to placement `p` on mesh dim `d`.
void place_parameter(Module& m, const std::string& name, int64_t d, const Placement& p, const Mesh& mesh) {
  for (const auto& [own, variable] : m.named_parameters(false)) {
    if (own != name) continue;
    Tensor value = variable.value();
    if (!(value.device_mesh() == mesh))
      throw MeshError("parallelize_module: parameter '" + name + "' lives on mesh " + value.device_mesh().to_string() +
                      ", not on " + mesh.to_string() + "; distribute the module there first");
    m.set_parameter(name, Variable(placed(value, d, p)));
  }
}

bool has_parameter(Module& m, const std::string& name) {
  for (const auto& [own, variable] : m.named_parameters(false))
    if (own == name) return true;
  return false;
}

// Each tensor in its placement on mesh dim d; std::nullopt leaves it, an empty list leaves all.
std::vector<Tensor> placed_each(std::vector<Tensor> tensors, int64_t d, const std::vector<std::optional<Placement>>& layouts,
                                const std::string& who, const char* what) {
  if (layouts.empty()) return tensors;
  if (layouts.size() != tensors.size())
    throw Error(who + " has " + std::to_string(layouts.size()) + " layouts for " + std::to_string(tensors.size()) + " " + what);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (layouts[i]) tensors[i] = placed_activation(tensors[i], d, *layouts[i]);
  return tensors;
}

// The reduce_dtype of `m`'s mixed precision policy when it is wider than `t`'s dtype. None under
// TESSERA_DETERMINISTIC=1: no floating-point sum is split across devices there (the partitioner
// gathers instead), so there is nothing to widen, and the 1-device bits are the promise.
std::optional<DType> wider_reduce_dtype(const Module& m, const Tensor& t) {
  const auto& policy = m.mixed_precision();
  if (!policy || !is_floating(t.dtype()) || dtype_size(policy->reduce_dtype) <= dtype_size(t.dtype()) || deterministic_mode())
    return std::nullopt;
  return policy->reduce_dtype;
}

// A style's input, placed on mesh dim d. Under a wider reduce_dtype its gradient (a column-
// parallel layer's input gradient is a partial sum over d) is reduced in that dtype, back into
// the layout the input came in.
Tensor placed_input(const Module& m, const Tensor& x, int64_t d, const Placement& p) {
  const auto reduce = wider_reduce_dtype(m, x);
  if (!reduce) return placed_activation(x, d, p);
  std::vector<Placement> placements = x.placements();
  placements[size_t(d)] = resolved(p, x.rank());
  return with_layout(x, Layout::from_placements(x.device_mesh(), placements, x.rank()), x.layout().without_partial(), *reduce);
}

// A style's output, placed on mesh dim d. Under a wider reduce_dtype a partial sum (a row-
// parallel layer's output) is widened first, so it is reduced in that dtype, then narrowed.
Tensor placed_output(const Module& m, const Tensor& y, int64_t d, const Placement& p) {
  const auto reduce = wider_reduce_dtype(m, y);
  if (!reduce || !y.layout().has_partial()) return placed_activation(y, d, p);
  return cast(placed_activation(cast(y, *reduce), d, p), y.dtype());
}

void redistribute_io(Module& m, int64_t d, std::optional<Placement> input, std::optional<Placement> output) {
  if (input)
    m.register_forward_pre_hook([d, p = *input](Module& self, std::vector<Tensor> inputs) {
      if (!inputs.empty()) inputs[0] = placed_input(self, inputs[0], d, p);
      return inputs;
    });
  if (output)
    m.register_forward_hook([d, p = *output](Module& self, const std::vector<Tensor>&, std::vector<Tensor> outputs) {
      if (!outputs.empty()) outputs[0] = placed_output(self, outputs[0], d, p);
      return outputs;
    });
}

}  // namespace

void parallelize_module(Module& module, const Mesh& mesh, const ParallelizePlan& plan, std::string tp_dim) {
  const int64_t d = mesh_dim_named(mesh, tp_dim, true, "parallelize_module");
  for (const auto& [path, style] : plan) {
    Module& m = module.get_submodule(path);
    const std::string where = "parallelize_module: '" + path + "'";
    std::visit(
        [&](const auto& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<S, ColwiseParallel> || std::is_same_v<S, RowwiseParallel>) {
            if (!has_parameter(m, "weight")) throw Error(where + " has no parameter 'weight' to shard");
            const bool colwise = std::is_same_v<S, ColwiseParallel>;
            place_parameter(m, "weight", d, colwise ? Placement{Shard{-1}} : Placement{Shard{0}}, mesh);
            place_parameter(m, "bias", d, colwise ? Placement{Shard{0}} : Placement{Replicate{}}, mesh);
            // A column-parallel layer needs its whole input (PyTorch's desired_input_layouts: Replicate);
            // input_layout is only the placement it arrives in, as in PyTorch.
            redistribute_io(m, d, colwise ? Placement{Replicate{}} : s.input_layout, s.output_layout);
          } else if constexpr (std::is_same_v<S, SequenceParallel>) {
            for (const auto& [own, variable] : m.named_parameters(false)) place_parameter(m, own, d, Replicate{}, mesh);
            redistribute_io(m, d, Shard{s.sequence_dim}, Shard{s.sequence_dim});
          } else if constexpr (std::is_same_v<S, PrepareModuleInput>) {
            m.register_forward_pre_hook([d, layouts = s.desired_input_layouts, where](Module&, std::vector<Tensor> inputs) {
              return placed_each(std::move(inputs), d, layouts, where + ": PrepareModuleInput", "inputs");
            });
          } else {
            m.register_forward_hook([d, layouts = s.desired_output_layouts, where](Module&, const std::vector<Tensor>&,
                                                                                     std::vector<Tensor> outputs) {
              return placed_each(std::move(outputs), d, layouts, where + ": PrepareModuleOutput", "outputs");
            });
          }
        },
        style);
  }
}

void fully_shard(Module& module, const Mesh& mesh, std::string dp_dim) {
  // A module given mixed precision already (apply_mixed_precision) keeps it, now gathered.
  fully_shard(module, mesh, module.mixed_precision().value_or(MixedPrecisionPolicy{}), std::move(dp_dim));
}

void fully_shard(Module& module, const Mesh& mesh, const MixedPrecisionPolicy& policy, std::string dp_dim) {
  check_mixed_precision_policy(policy, "fully_shard");
  const std::optional<MixedPrecisionPolicy> installed = module.mixed_precision();
  if (installed && !(*installed == policy))
    throw Error("fully_shard: the module has another mixed precision policy already (param_dtype " +
                std::string(dtype_name(installed->param_dtype)) + "); give the same one, or none");
  const int64_t d = mesh_dim_named(mesh, dp_dim, false, "fully_shard");
  const bool mixed = !(policy == MixedPrecisionPolicy{});
  for (const auto& [name, m] : module.named_modules()) {
    for (const auto& [own, variable] : m->named_parameters(false)) {
      const Tensor value = variable.value();
      if (!(value.device_mesh() == mesh))
        throw MeshError("fully_shard: parameter '" + (name.empty() ? own : name + "." + own) + "' lives on mesh " +
                        value.device_mesh().to_string() + ", not on " + mesh.to_string());
      if (value.rank() == 0) continue;  // a scalar stays whole
      // dp splits each tensor-parallel shard of axis 0 further (innermost: "tp+dp", FSDP2's
      // _StridedShard), so a tp-sharded weight gradient, summed over dp, is reduce_scattered
      // straight into the shard, not first gathered over tp and sharded again.
      m->set_parameter(own, Variable(with_layout(value, value.layout().with_placement(d, Shard{0}))));
    }
    // Forward sees each parameter whole along the dp dim: one all_gather before use, and the
    // gradient of that relayout is a reduce_scatter back to the shard.
    if (!mixed) {
      m->set_parameter_view(
          [d](const Tensor& value) {
            return value.rank() == 0 ? value : with_layout(value, value.layout().with_placement(d, Replicate{}));
          },
          /*fully_sharded=*/true);
      continue;
    }
    // Mixed precision: the shard is cast, then gathered; its gradient reduce_scattered in reduce_dtype.
    m->set_mixed_precision(policy);
    m->set_parameter_view(
        [d, policy](const Tensor& value) {
          const Layout whole = value.rank() > 0 ? value.layout().with_placement(d, Replicate{}) : value.layout();
          return mixed_precision_view(value, whole, policy);
        },
        /*fully_sharded=*/true);
  }
  if (mixed && !installed) install_mixed_precision_hooks(module, policy);
}

}  // namespace tessera
