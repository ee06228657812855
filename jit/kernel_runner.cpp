#include "jit/kernel_runner.hpp"

#include <atomic>

#include "dsl/error.hpp"

namespace tessera {
namespace {

KernelRunner& slot() {
  static KernelRunner runner;
  return runner;
}
std::atomic<bool> active{false};
std::optional<kir::LoopTarget> substituted_target;  // written only while `active` is being set

}  // namespace

KernelRunnerScope::KernelRunnerScope(KernelRunner runner, std::optional<kir::LoopTarget> lower_for) {
  if (active.exchange(true)) throw Error("KernelRunnerScope: a substitute kernel runner is already in force");
  slot() = std::move(runner);
  substituted_target = lower_for;
}

KernelRunnerScope::~KernelRunnerScope() {
  substituted_target.reset();
  active = false;
  slot() = nullptr;
}

const KernelRunner* substitute_kernel_runner() { return active.load(std::memory_order_acquire) ? &slot() : nullptr; }

std::optional<kir::LoopTarget> substitute_lowering_target() {
  return active.load(std::memory_order_acquire) ? substituted_target : std::nullopt;
}

}  // namespace tessera
