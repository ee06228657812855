#include "nn/mixed_precision.hpp"

#include <string>
#include <utility>

#include "dsl/error.hpp"
#include "dsl/ops.hpp"

namespace tessera {
namespace {

std::vector<Tensor> cast_floating(std::vector<Tensor> values, DType dtype) {
  for (Tensor& v : values)
    if (is_floating(v.dtype())) v = cast(v, dtype);
  return values;
}

}  // namespace

void check_mixed_precision_policy(const MixedPrecisionPolicy& policy, const char* who) {
  for (const auto& [name, dtype] : {std::pair{"param_dtype", policy.param_dtype}, std::pair{"reduce_dtype", policy.reduce_dtype},
                                    std::pair{"output_dtype", policy.output_dtype}})
    if (!is_floating(dtype))
      throw DTypeError(std::string(who) + ": MixedPrecisionPolicy's " + name + " must be a floating dtype, got " +
                       std::string(dtype_name(dtype)));
}

Tensor mixed_precision_view(const Tensor& parameter, const Layout& wanted, const MixedPrecisionPolicy& policy) {
  if (!is_floating(parameter.dtype())) return wanted == parameter.layout() ? parameter : with_layout(parameter, wanted);
  const Tensor used = cast(parameter, policy.param_dtype);
  if (wanted == parameter.layout() && used.dtype() == parameter.dtype() && policy.reduce_dtype == parameter.dtype())
    return parameter;
  // Cast first: the gather moves param_dtype bytes. Gathered (FSDP), the gradient comes back in
  // the parameter's own layout, reduced there in reduce_dtype (FSDP2's reduce_scatter after
  // each module's backward), and is then cast to the parameter's dtype by the cast's gradient.
  // Used where it lies and summed in its own dtype, its partial sums are left to the
  // partitioner, still in reduce_dtype wherever reduced: a pipeline's microbatches add their
  // terms and reduce the sum once (it reduced every tick's).
  const bool left_partial = wanted == parameter.layout() && policy.reduce_dtype == parameter.dtype();
  const std::optional<Layout> gradient_layout =
      left_partial ? std::nullopt : std::optional<Layout>(parameter.layout().without_partial());
  return with_layout(used, wanted, gradient_layout, policy.reduce_dtype);
}

void install_mixed_precision_hooks(Module& module, const MixedPrecisionPolicy& policy) {
  module.register_forward_pre_hook(
      [dtype = policy.param_dtype](Module&, std::vector<Tensor> inputs) { return cast_floating(std::move(inputs), dtype); });
  module.register_forward_hook([dtype = policy.output_dtype](Module&, const std::vector<Tensor>&, std::vector<Tensor> outputs) {
    return cast_floating(std::move(outputs), dtype);
  });
}

void apply_mixed_precision(Module& module, const MixedPrecisionPolicy& policy) {
  check_mixed_precision_policy(policy, "apply_mixed_precision");
  // Checked for every module before any is changed, so a refused call leaves the model as it was.
  for (const auto& [name, m] : module.named_modules()) {
    const std::string which = "apply_mixed_precision: module '" + (name.empty() ? std::string("(root)") : name) + "'";
    if (m->is_fully_sharded()) throw Error(which + " is fully sharded already; give fully_shard the policy instead");
    // Once was enough: a second call would cast the first call's view again.
    if (const auto& installed = m->mixed_precision())
      throw Error(which + " has mixed precision applied already (param_dtype " + std::string(dtype_name(installed->param_dtype)) +
                  " by an earlier apply_mixed_precision); it is applied once");
  }
  for (const auto& [name, m] : module.named_modules()) {
    m->set_parameter_view([policy](const Tensor& value) { return mixed_precision_view(value, value.layout(), policy); });
    m->set_mixed_precision(policy);
  }
  install_mixed_precision_hooks(module, policy);
}

}  // namespace tessera
