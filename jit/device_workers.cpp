#include "jit/device_workers.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <pthread.h>
#include <sched.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "comm/machine_load.hpp"
#include "comm/spin_barrier.hpp"
#include "comm/spin_latch.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

void set_flush_denormals() {
#if defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) | DAZ (bit 6)
#endif
}

// The CPUs this process may run on (taskset, a cgroup, mpirun's binding), in order.
const std::vector<int>& allowed_cpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> out;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
  }();
  return cpus;
}

// Pool threads are bound to CPUs, and each call places its devices' threads relative to the
// CPU its caller is on: a sleeping thread's wake-up may otherwise put it on its waker's CPU and
// keep it there. On this project's 2-core VMs a device's helper ran on the caller's core in
// about half the processes, and split kernels took 2-5x their time. Not bound where clients
// share the machine (mpirun binds them, or the OS spreads them) or one CPU is allowed: there a
// slot is only a name.
bool binds_threads() {
  static const bool binds = allowed_cpus().size() > 1 && clients_on_this_machine() == 1;
  return binds;
}

int slot_count() { return std::max<int>(1, int(allowed_cpus().size())); }

thread_local int bound_slot = -1;  // a pool thread's CPU slot; -1 on other threads

void bind_to_slot(int slot) {
  bound_slot = slot;
  if (!binds_threads()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(allowed_cpus()[size_t(slot)], &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // advisory: unbound still runs
}

// The slot of the CPU the calling thread runs on (a pool thread's own; else where it is now).
int current_slot() {
  if (bound_slot >= 0) return bound_slot;
  const std::vector<int>& cpus = allowed_cpus();
  const auto it = std::find(cpus.begin(), cpus.end(), sched_getcpu());
  return it == cpus.end() ? 0 : int(it - cpus.begin());
}

class Worker {
 public:
  explicit Worker(int slot) : thread_([this, slot] {
    bind_to_slot(slot);
    loop();
  }) {}
  ~Worker() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  // `spins`: how long the worker spins for the next job once this one is done, as a barrier
  // would (comm/spin_barrier.hpp): briefly where the call's threads outnumber the cores, as it
  // would hold a core a device still needs.
  void post(std::function<void()> job, int spins) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
      spins_after_.store(spins, std::memory_order_relaxed);
      pending_.store(true, std::memory_order_release);
    }
    ready_.notify_one();
  }

 private:
  void loop() {
    set_flush_denormals();
    while (true) {
      // Back-to-back calls (a training loop) find the worker awake: spin a little before sleeping.
      const int spins = spins_before_sleeping(spins_after_.load(std::memory_order_relaxed));
      for (int spin = 0; spin < spins && !pending_.load(std::memory_order_acquire); ++spin) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        pending_.store(!jobs_.empty(), std::memory_order_release);
      }
      job();
    }
  }
  std::atomic<bool> pending_{false};
  std::atomic<int> spins_after_{0};
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

class WorkerPool {
 public:
  // The `index`-th device thread on CPU slot `slot` (threads of one call are distinct).
  Worker& device_thread(int slot, int index) { return get(devices_, slot, index); }
  // A device's helper thread on CPU slot `slot`: helpers never queue behind another device's
  // work, which may be waiting in a collective for this device.
  Worker& helper(int64_t device, int slot) { return get(helpers_, slot, device); }

 private:
  using Threads = std::map<std::pair<int, int64_t>, std::unique_ptr<Worker>>;
  Worker& get(Threads& threads, int slot, int64_t owner) {
    std::lock_guard lock(mutex_);
    auto& w = threads[{slot, owner}];
    if (!w) w = std::make_unique<Worker>(slot);
    return *w;
  }
  std::mutex mutex_;
  Threads devices_, helpers_;
};

WorkerPool& pool() {
  static WorkerPool instance;
  return instance;
}

}  // namespace

// Sets flush-to-zero / denormals-are-zero for the caller while it stands in for a device.
class FlushDenormalsScope {
 public:
  FlushDenormalsScope() {
#if defined(__x86_64__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);
#endif
  }
  ~FlushDenormalsScope() {
#if defined(__x86_64__)
    _mm_setcsr(saved_);
#endif
  }

 private:
  unsigned saved_ = 0;
};

void run_on_devices(const std::vector<int64_t>& device_indices, const std::function<void(int64_t)>& task) {
  if (device_indices.empty()) return;  // a mesh with no device on this client
  if (std::set<int64_t>(device_indices.begin(), device_indices.end()).size() != device_indices.size())
    throw InternalError("run_on_devices: a device appears twice (its collectives would deadlock)");
  // One dispatch at a time: the devices' collectives must meet in the same order.
  static std::mutex dispatch_mutex;
  std::lock_guard dispatch(dispatch_mutex);
  std::mutex error_mutex;
  std::exception_ptr first_error;
  auto guarded = [&](int64_t i) {
    try {
      task(i);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  };
  // The caller runs the first device's share itself (one thread wake-up fewer per call); device
  // i runs on the CPU slot i * (its cores) after the caller's, its helpers on the slots between.
  const int slots = slot_count(), first = current_slot();
  const int cores = cores_per_device(int64_t(device_indices.size()));
  const int spins = spin_iterations_for(int64_t(device_indices.size()) * cores * clients_on_this_machine());
  SpinLatch done(int(device_indices.size()) - 1, spins);
  for (size_t i = 1; i < device_indices.size(); ++i) {
    // Device i is the (i * cores / slots)-th on its slot: the caller is the first on its own.
    const int64_t placed = int64_t(i) * cores;
    pool().device_thread(int((first + placed) % slots), int(placed / slots)).post([&, i] {
      guarded(int64_t(i));
      done.count_down();
    }, spins);
  }
  {
    FlushDenormalsScope ftz;
    const int previous = bound_slot;
    bound_slot = first;  // the caller's run_split places helpers from here
    guarded(0);
    bound_slot = previous;
  }
  done.wait();
  if (first_error) std::rethrow_exception(first_error);
}

void run_split(int64_t device, int parts, const std::function<void(int)>& part) {
  // While other processes want the cores, fewer threads each run several parts (t, t + threads,
  // ...): the same parts, so the same values, without a helper that waits for a core at every
  // kernel (comm/machine_load.hpp).
  const int threads = threads_free_for(parts);
  auto run_parts = [&](int first) {
    for (int p = first; p < parts; p += threads) part(p);
  };
  if (threads <= 1) {
    run_parts(0);
    return;
  }
  const int spins = spin_iterations_for(threads);  // a device's parts each have a core of their own
  SpinLatch done(threads - 1, spins);
  std::mutex error_mutex;
  std::exception_ptr first_error;
  const int own = current_slot(), slots = slot_count();
  for (int t = 1; t < threads; ++t)
    pool().helper(device, (own + t) % slots).post([&, t] {
      try {
        run_parts(t);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      done.count_down();
    }, spins);
  run_parts(0);
  done.wait();
  if (first_error) std::rethrow_exception(first_error);
}

namespace {

// Settings are read once: this runs on every program call.
int environment_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::max(1, std::atoi(v)) : fallback;
}

std::atomic<int> cores_override{0};  // set_cores_per_device; 0 = from the environment / automatic

}  // namespace

void set_cores_per_device(int cores) { cores_override = std::max(0, cores); }
int cores_per_device_override() { return cores_override.load(std::memory_order_relaxed); }

int cores_per_device(int64_t devices) {
  if (int forced = cores_override.load(std::memory_order_relaxed)) return forced;
  static const int from_environment = environment_int("TESSERA_CORES_PER_DEVICE", 0);
  if (from_environment) return from_environment;
  // Clients sharing this machine (mpirun's local size) share its cores too.
  return std::max<int>(1, machine_cores() / int(std::max<int64_t>(1, devices) * clients_on_this_machine()));
}

}  // namespace tessera
