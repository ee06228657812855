#include "jit/device_workers.hpp"

#include <condition_variable>
#include <deque>
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
    }
    ready_.notify_one();
  }

 private:
  void loop() {
    set_flush_denormals();
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
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

 private:
  std::mutex mutex_;
  std::deque<std::unique_ptr<Worker>> workers_;
};

WorkerPool& pool() {
  static WorkerPool instance;
  return instance;
}

}  // namespace

void run_on_devices(const std::vector<int64_t>& device_indices, const std::function<void(int64_t)>& task) {
  if (std::set<int64_t>(device_indices.begin(), device_indices.end()).size() != device_indices.size())
    throw InternalError("run_on_devices: a device appears twice (its collectives would deadlock)");
  std::latch done(int64_t(device_indices.size()));
  std::mutex error_mutex;
  std::exception_ptr first_error;
  for (size_t i = 0; i < device_indices.size(); ++i) {
    pool().worker(device_indices[i]).post([&, i] {
      try {
        task(int64_t(i));
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      done.count_down();
    });
  }
  done.wait();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace tessera
