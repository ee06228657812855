// Mixed precision for modules, with FSDP2's MixedPrecisionPolicy: parameters kept in f32 (the
// master weights the optimizer updates) and used in `param_dtype`, gradients reduced over the
// data-parallel dims in `reduce_dtype`, the module's outputs cast to `output_dtype`.
//
// fully_shard(module, mesh, policy) (nn/parallel_styles.hpp) casts each parameter's shard before
// it is gathered, so the all_gather moves param_dtype bytes; apply_mixed_precision does the same
// for a module that is not fully sharded (replicated over dp, or tensor-parallel only).
#pragma once

#include "dsl/dtype.hpp"
#include "nn/mixed_precision_policy.hpp"
#include "nn/module.hpp"

namespace tessera {

// The policy's parameter view for one parameter value: cast to param_dtype, then made
// `wanted` (fully_shard's gather over dp; the value's own layout otherwise), its gradient cast to
// reduce_dtype and reduced into the parameter's own layout right there. The default policy on an
// f32 parameter adds nothing beyond the relayout.
Tensor mixed_precision_view(const Tensor& parameter, const Layout& wanted, const MixedPrecisionPolicy& policy);

// DTypeError naming `who` and the field when a dtype of the policy is not floating.
void check_mixed_precision_policy(const MixedPrecisionPolicy& policy, const char* who);
// Forward hooks on `module`: floating inputs cast to param_dtype, floating outputs to output_dtype.
void install_mixed_precision_hooks(Module& module, const MixedPrecisionPolicy& policy);

// Installs `policy` on `module` and every submodule: parameter views as above (their layouts
// unchanged), and hooks on `module` itself that cast its floating inputs to param_dtype and its
// floating outputs to output_dtype. DTypeError for a non-floating dtype in the policy; Error
// naming the module for one given mixed precision already (by an earlier call or fully_shard's
// policy) or fully sharded already (fully_shard takes the policy itself).
void apply_mixed_precision(Module& module, const MixedPrecisionPolicy& policy);

}  // namespace tessera
