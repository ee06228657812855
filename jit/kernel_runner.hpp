// Who runs a compiled program's kernels. By default each kernel's LLVM-compiled function; a
// substitute (the tests' kernel-IR interpreter, the oracle the renderers are checked against)
// can take over every kernel of every program for a while. Process-wide: kernels run on the
// device threads, not the caller's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "codegen/kernel_ir.hpp"

namespace tessera {

using KernelRunner =
    std::function<void(const kir::Kernel& kernel, void** buffers, const int64_t* params, int64_t begin, int64_t end)>;

// While alive, `runner` runs every kernel instead of the compiled code (not nestable). With
// `lower_for`, programs compiled meanwhile are lowered as for that target whatever their
// devices, so a machine without a GPU runs (and checks) the kernels a GPU would.
class KernelRunnerScope {
 public:
  explicit KernelRunnerScope(KernelRunner runner, std::optional<kir::LoopTarget> lower_for = std::nullopt);
  ~KernelRunnerScope();
  KernelRunnerScope(const KernelRunnerScope&) = delete;
  KernelRunnerScope& operator=(const KernelRunnerScope&) = delete;
};

// The substitute in force, or null.
const KernelRunner* substitute_kernel_runner();

// The target programs are lowered for while a scope with `lower_for` is in force.
std::optional<kir::LoopTarget> substitute_lowering_target();

}  // namespace tessera
