#include "jit/device_workers.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <exception>
#include <latch>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "dsl/error.hpp"

namespace tessera {
namespace {

void set_flush_denormals() {
#if defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) | DAZ (bit 6)
#endif
}

class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
      pending_.store(true, std::memory_order_release);
    }
    ready_.notify_one();
  }

 private:
  void loop() {
    set_flush_denormals();
    while (true) {
      // Back-to-back calls (a training loop) find the worker awake: spin a little before sleeping.
      for (int spin = 0; spin < 20000 && !pending_.load(std::memory_order_acquire); ++spin) {
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
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

class WorkerPool {
 public:
  Worker& worker(int64_t index) {
    std::lock_guard lock(mutex_);
    while (int64_t(workers_.size()) <= index) workers_.push_back(std::make_unique<Worker>());
    return *workers_[index];
  }
  // Helper threads of a device (its extra cores), distinct from every device's own worker.
  Worker& helper(int64_t device, int slot) {
    std::lock_guard lock(mutex_);
    auto& h = helpers_[{device, slot}];
    if (!h) h = std::make_unique<Worker>();
    return *h;
  }

 private:
  std::mutex mutex_;
  std::deque<std::unique_ptr<Worker>> workers_;
  std::map<std::pair<int64_t, int>, std::unique_ptr<Worker>> helpers_;
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
  // The caller runs the first device's share itself: one thread wake-up fewer per call.
  std::latch done(int64_t(device_indices.size()) - 1);
  for (size_t i = 1; i < device_indices.size(); ++i)
    pool().worker(device_indices[i]).post([&, i] {
      guarded(int64_t(i));
      done.count_down();
    });
  {
    FlushDenormalsScope ftz;
    guarded(0);
  }
  done.wait();
  if (first_error) std::rethrow_exception(first_error);
}

void run_split(int64_t device, int parts, const std::function<void(int)>& part) {
  if (parts <= 1) {
    part(0);
    return;
  }
  std::latch done(parts - 1);
  std::mutex error_mutex;
  std::exception_ptr first_error;
  for (int p = 1; p < parts; ++p)
    pool().helper(device, p).post([&, p] {
      try {
        part(p);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      done.count_down();
    });
  part(0);
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

int machine_cores() {
  static const int cores = std::max(1, int(std::thread::hardware_concurrency()));  // reads /sys each call: once is enough
  return cores;
}

int clients_on_this_machine() {
  static const int clients = environment_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  return clients;
}

int cores_per_device(int64_t devices) {
  if (int forced = cores_override.load(std::memory_order_relaxed)) return forced;
  static const int from_environment = environment_int("TESSERA_CORES_PER_DEVICE", 0);
  if (from_environment) return from_environment;
  // Clients sharing this machine (mpirun's local size) share its cores too.
  return std::max<int>(1, machine_cores() / int(std::max<int64_t>(1, devices) * clients_on_this_machine()));
}

}  // namespace tessera
