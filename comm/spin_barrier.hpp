// A reusable barrier for the threads of one in-process group: spins briefly (collectives between
// busy device threads arrive within microseconds), then sleeps on a futex via atomic::wait.
#pragma once

#include <atomic>
#include <cstdint>

namespace tessera {

class SpinBarrier {
 public:
  SpinBarrier(int participants, int spin_iterations)
      : participants_(participants), spin_iterations_(spin_iterations) {}

  void arrive_and_wait() {
    const uint32_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == participants_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);  // reset before anyone can arrive again
      generation_.fetch_add(1, std::memory_order_release);
      generation_.notify_all();
      return;
    }
    for (int i = 0; i < spin_iterations_; ++i) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    while (generation_.load(std::memory_order_acquire) == generation)
      generation_.wait(generation, std::memory_order_acquire);
  }

 private:
  const int participants_;
  const int spin_iterations_;
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
};

}  // namespace tessera
