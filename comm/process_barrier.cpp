#include "comm/process_barrier.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <ctime>

#include "comm/machine_load.hpp"

namespace tessera {
namespace {

constexpr int kYields = 200;

uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

// Sleeps while *word == expected, at most `nanoseconds` (shared futex: no FUTEX_PRIVATE_FLAG).
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, long nanoseconds) {
  timespec limit{nanoseconds / 1000000000L, nanoseconds % 1000000000L};
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &limit, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) { syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

}  // namespace

void ProcessBarrier::arrive_and_wait(double timeout_seconds, const std::function<void()>& on_timeout) {
  ProcessBarrierState& s = *state_;
  const uint32_t generation = s.generation.load(std::memory_order_acquire);
  if (s.arrived.fetch_add(1, std::memory_order_acq_rel) == uint32_t(participants_ - 1)) {
    s.arrived.store(0, std::memory_order_relaxed);  // reset before anyone can arrive again
    s.generation.fetch_add(1, std::memory_order_seq_cst);
    // A sleeper counts itself before its last look at the generation, so either it sees the new
    // generation or this sees it counted (both seq_cst).
    if (s.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(s.generation);
    return;
  }
  const int spins = spins_before_sleeping(spin_iterations_);  // a few dozen under the passive policy
  for (int i = 0; i < spins; ++i) {
    if (s.generation.load(std::memory_order_acquire) != generation) return;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  // Then hand the core over a while before sleeping: with more processes than cores the late
  // one may be waiting for exactly this core, and a futex round trip costs tens of microseconds.
  for (int i = 0; i < kYields; ++i) {
    if (s.generation.load(std::memory_order_acquire) != generation) return;
    sched_yield();
  }
  const auto start = std::chrono::steady_clock::now();
  s.sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (s.generation.load(std::memory_order_seq_cst) == generation) {
    // Wake up now and then to check the deadline.
    futex_wait(s.generation, generation, 100'000'000L);
    if (timeout_seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_seconds &&
        s.generation.load(std::memory_order_acquire) == generation)
      on_timeout();
  }
  s.sleepers.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace tessera
