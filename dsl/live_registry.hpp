// The logs of every live object of one kind that watches what the runtime does (collective
// recorders, pending-value watches, CommDebugMode's parameter log): each object opens a log on
// construction and closes it on destruction; the runtime appends to every open log at once, and
// asks first, for free, whether any is open.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace tessera {

template <class Log>
class LiveRegistry {
 public:
  std::shared_ptr<Log> open() {
    auto log = std::make_shared<Log>();
    std::lock_guard lock(mutex_);
    logs_.push_back(log);
    open_count_.fetch_add(1, std::memory_order_relaxed);
    return log;
  }
  void close(const std::shared_ptr<Log>& log) {
    std::lock_guard lock(mutex_);
    std::erase(logs_, log);
    open_count_.fetch_sub(1, std::memory_order_relaxed);
  }
  bool any_open() const { return open_count_.load(std::memory_order_relaxed) > 0; }
  // fn(Log&) on every open log, under the registry's lock.
  template <class Fn>
  void for_each_open(Fn&& fn) {
    std::lock_guard lock(mutex_);
    for (auto& log : logs_) fn(*log);
  }
  // fn(const Log&) under the lock: a consistent read of one log while others append.
  template <class Fn>
  auto read(const Log& log, Fn&& fn) const {
    std::lock_guard lock(mutex_);
    return fn(log);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<Log>> logs_;
  std::atomic<int> open_count_{0};
};

}  // namespace tessera
