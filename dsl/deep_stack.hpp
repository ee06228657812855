// Passes that follow a program's data flow depth first (the partitioner's expansion, for one)
// recurse once per op along the longest chain of dependent ops. On a thread's usual 8 MiB stack
// that overflowed at about 4,000 ops in a chain (an unrolled loop, a deep model's gradient
// accumulation over many microbatches): the process died. on_deep_stack runs such a pass on a
// thread of its own whose stack is large enough for chains of some hundred thousand ops, as
// compilers do for their recursive passes (LLVM's CrashRecoveryContext::RunSafelyOnThread).
// Stack pages are committed only when touched, so a short chain costs the thread's start
// (tens of microseconds), not the reservation.
#pragma once

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace tessera {

// The stack reserved for a deep pass.
inline constexpr size_t kDeepStackBytes = size_t(1) << 30;

// Runs `work` to completion on a thread with a kDeepStackBytes stack and rethrows what it
// threw; runs it here when this thread already is one (a pass inside a pass) or when the
// system refuses the reservation (then as deep as this thread's stack allows).
void run_on_deep_stack(const std::function<void()>& work);

template <class F>
auto on_deep_stack(F&& f) -> std::invoke_result_t<F&> {
  using Result = std::invoke_result_t<F&>;
  if constexpr (std::is_void_v<Result>) {
    run_on_deep_stack(f);
  } else {
    std::optional<Result> result;
    run_on_deep_stack([&] { result.emplace(f()); });
    return std::move(*result);
  }
}

}  // namespace tessera
