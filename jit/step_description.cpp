#include "jit/step_description.hpp"

#include <fmt/format.h>

#include "codegen/step_costs.hpp"
#include "dsl/attention_parts.hpp"
#include "dsl/string_util.hpp"
#include "jit/executable.hpp"

namespace tessera {

std::string describe_step(const Executable& exe, const ScheduledStep& step, size_t device) {
  const LocalProgram& p = exe.program();
  const std::vector<int64_t>& params = p.device_params[device];
  const std::vector<int64_t> coords = p.mesh.coords(p.device_ids[device]);
  const LocalNode& n = p.nodes[step.node];
  const auto shape = n.shape_on(params);
  switch (step.kind) {
    case ScheduledStep::Kind::Kernel: {
      const auto& k = exe.schedule().kernels[step.kernel];
      return fmt::format("kernel {:<3} [{}] -> {} {}", step.kernel, join(k.fused_ops, ", "),
                         dtype_name(n.dtype), shape_string(shape));
    }
    case ScheduledStep::Kind::Gemm: {
      const auto a = p.nodes[n.inputs[0]].shape_on(params);
      // BLAS's names: sgemm, dgemm; bf16 operands with f32 sums are oneDNN's and PyTorch's "bf16 gemm".
      const char* name = n.dtype == DType::f32 ? "sgemm" : n.dtype == DType::f64 ? "dgemm" : "bf16 gemm";
      return fmt::format("gemm       {} {} x {} -> {}: {} multiplications", name,
                         shape_string(a), shape_string(p.nodes[n.inputs[1]].shape_on(params)), shape_string(shape),
                         dot_multiplies(p, n, params));
    }
    case ScheduledStep::Kind::GroupedGemm:
      // The multiplications of every row in a group, an upper bound: the sizes are known at run time.
      return fmt::format("gemm       {} {} -> {}: at most {} multiplications", op_name(n.op),
                         join(n.inputs, " ", [&](int in) { return shape_string(p.nodes[in].shape_on(params)); }),
                         shape_string(shape), dot_multiplies(p, n, params));
    case ScheduledStep::Kind::Attention:
      return fmt::format("attention  {} {} -> {}: {} multiplications", attention_part_name(attention_attrs(n.attrs).part),
                         join(n.inputs, " ", [&](int in) { return shape_string(p.nodes[in].shape_on(params)); }),
                         shape_string(shape), dot_multiplies(p, n, params));
    case ScheduledStep::Kind::Redistribute:
      if (step.outputs.size() > 1)
        return fmt::format("{:<14} over {}: {} bytes of {}, a bucket of {}: {}", redistribute_kind_name(n.step.kind),
                           p.mesh.dim_names()[n.step.mesh_dim], received_bytes(p, step, params, coords), dtype_name(n.dtype), step.outputs.size(),
                           join(step.outputs, " ", [&](int o) { return shape_string(p.nodes[o].shape_on(params)); }));
      // The dtype is the wire's and, for a reduction, the sums' (mixed precision's reduce_dtype).
      return fmt::format("{:<14} over {}: {} bytes of {}, {} -> [{}]", redistribute_kind_name(n.step.kind),
                         p.mesh.dim_names()[n.step.mesh_dim], received_elements(p, n, params, coords) * dtype_size(n.dtype), dtype_name(n.dtype),
                         shape_string(shape), join(n.layout.sharding_specs(), ","));
  }
  return {};
}

}  // namespace tessera
