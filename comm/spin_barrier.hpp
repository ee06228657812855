// A reusable barrier for the threads of one in-process group: spins briefly (collectives between
// busy device threads arrive within microseconds), then sleeps on a futex via atomic::wait (after
// a few dozen spins under TESSERA_WAIT_POLICY=passive: comm/machine_load.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "comm/machine_load.hpp"

namespace tessera {

// How long a waiter spins before it sleeps: long while every busy thread has a core of its own
// (the late one arrives within microseconds), short when they outnumber the cores (a spinning
// waiter would hold the core the late one needs).
inline int spin_iterations_for(int64_t busy_threads) {
  static const int64_t cores = int64_t(std::thread::hardware_concurrency());
  return busy_threads <= cores ? 20000 : 64;
}

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
    const int spins = spins_before_sleeping(spin_iterations_);
    for (int i = 0; i < spins; ++i) {
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
