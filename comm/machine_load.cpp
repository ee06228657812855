#include "comm/machine_load.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "comm/cpu_time_sample.hpp"
#include "comm/machine_cores.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

WaitPolicy wait_policy() {
  static const WaitPolicy policy = parse_wait_policy(std::getenv("TESSERA_WAIT_POLICY"));
  return policy;
}

// This job's other clients on this machine are expected to keep their share of the cores busy:
// their work is not other work.
double cores_of_peer_clients() {
  const int clients = clients_on_this_machine();
  return double(clients - 1) * double(machine_cores()) / double(clients);
}

constexpr int64_t kSampleInterval = 100'000'000;  // ns

struct LoadState {
  std::mutex sampling;                        // one sampler at a time; the others read the last value
  CpuTimeSample last;                         // under `sampling`
  std::atomic<int64_t> last_ns{0};            // when `last` was taken (steady clock; 0: never)
  std::atomic<double> busy_elsewhere{0};
};

LoadState& state() {
  static LoadState s;
  return s;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

WaitPolicy parse_wait_policy(const char* text) {
  if (!text || !*text || std::strcmp(text, "auto") == 0) return WaitPolicy::Auto;
  if (std::strcmp(text, "active") == 0) return WaitPolicy::Active;
  if (std::strcmp(text, "passive") == 0) return WaitPolicy::Passive;
  throw Error(std::string("TESSERA_WAIT_POLICY='") + text + "': the policies are auto, active and passive");
}

double cores_busy_elsewhere() {
  LoadState& s = state();
  const int64_t now = now_ns();
  if (now - s.last_ns.load(std::memory_order_relaxed) >= kSampleInterval) {
    std::unique_lock lock(s.sampling, std::try_to_lock);
    if (lock.owns_lock() && now - s.last_ns.load(std::memory_order_relaxed) >= kSampleInterval) {
      const CpuTimeSample sample = sample_cpu_time();
      if (s.last.valid)
        s.busy_elsewhere.store(std::max(0.0, others_share(s.last, sample) * machine_cores() - cores_of_peer_clients()), std::memory_order_relaxed);
      s.last = sample;
      s.last_ns.store(now, std::memory_order_relaxed);
    }
  }
  return s.busy_elsewhere.load(std::memory_order_relaxed);
}

bool cores_wanted_elsewhere() { return wait_policy() != WaitPolicy::Active && cores_busy_elsewhere() >= 0.5; }

int spins_before_sleeping(int spins) { return wait_policy() == WaitPolicy::Passive ? std::min(spins, 64) : spins; }

int threads_free_for(int threads) {
  if (threads <= 1 || !cores_wanted_elsewhere()) return std::max(threads, 1);
  const double free_cores = std::max(0.0, double(machine_cores()) - cores_busy_elsewhere());
  return std::clamp(int(double(threads) * free_cores / double(machine_cores())), 1, threads);
}

}  // namespace tessera
