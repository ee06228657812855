// A single-use countdown for a caller waiting on its helpers' parts: the waiter spins briefly, then
// sleeps on a futex via atomic::wait, as SpinBarrier does (comm/spin_barrier.hpp).
//
// std::latch sleeps after a handful of spins, so a caller that finished its own part a few
// microseconds before its helper went to sleep and had to be woken: a fork and join of two empty
// parts took 3 us on this project's 2-core VM, and a one-device GPT step on 2 cores splits some
// 800 kernels and GEMMs this way.
#pragma once

#include <atomic>
#include "comm/machine_load.hpp"

namespace tessera {

class SpinLatch {
 public:
  SpinLatch(int count, int spin_iterations) : remaining_(count), spin_iterations_(spin_iterations) {}
  SpinLatch(const SpinLatch&) = delete;
  SpinLatch& operator=(const SpinLatch&) = delete;

  void count_down() {
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_all();
  }

  void wait() {
    const int spins = spins_before_sleeping(spin_iterations_);
    for (int i = 0; i < spins; ++i) {
      if (remaining_.load(std::memory_order_acquire) == 0) return;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    for (int left = remaining_.load(std::memory_order_acquire); left != 0; left = remaining_.load(std::memory_order_acquire))
      remaining_.wait(left, std::memory_order_acquire);
  }

 private:
  std::atomic<int> remaining_;  // int: a futex word, waited on directly
  const int spin_iterations_;
};

}  // namespace tessera
