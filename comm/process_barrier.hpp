// A reusable barrier for processes that share memory (the clients of one node): the state lives
// in a shared segment. Waiters spin briefly, then sleep on a process-shared futex (std::atomic's
// wait is process-private in libstdc++, so it cannot be used across processes).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace tessera {

// Placed in shared memory, zero-filled before first use (a fresh segment is).
struct ProcessBarrierState {
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
  std::atomic<uint32_t> sleepers;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "process-shared atomics must be lock-free");

class ProcessBarrier {
 public:
  // `spin_iterations`: pauses before sleeping; long when every waiting process has a core of
  // its own, short when processes outnumber cores (a spinning waiter would hold the core the
  // late one needs).
  ProcessBarrier(ProcessBarrierState* state, int participants, int spin_iterations)
      : state_(state), participants_(participants), spin_iterations_(spin_iterations) {}

  // Waits for every participant. With `timeout_seconds` > 0, calls `on_timeout` (which must not
  // return) once the wait has lasted that long.
  void arrive_and_wait(double timeout_seconds, const std::function<void()>& on_timeout);

 private:
  ProcessBarrierState* state_;
  const int participants_;
  const int spin_iterations_;
};

}  // namespace tessera
