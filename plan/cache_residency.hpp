// Which values a CPU device's cache (Hardware::cache_bytes, and the shared_cache_bytes behind it:
// one CacheResidency each) holds as a plan walks its steps (plan/plan_report.cpp):
// every value a step reads or writes becomes the most recently touched, and the least recently
// touched leave once the values exceed the cache. A kernel's bytes found there are charged the
// cache's bandwidth, the rest the memory's: the values a kernel's producers just wrote are read
// from the cache (a small model's steps run from it), a large one's saved activations are not.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera {

class CacheResidency {
 public:
  explicit CacheResidency(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The bytes of `reads` (value, bytes) the cache holds now and of `writes` it can take; then
  // all of them touched, the least recently touched others leaving as needed.
  int64_t touch(const std::vector<std::pair<int, int64_t>>& reads, const std::vector<std::pair<int, int64_t>>& writes);

 private:
  void make_recent(int value, int64_t bytes);

  int64_t capacity_, held_ = 0;
  std::list<std::pair<int, int64_t>> recent_;  // most recently touched first
  std::unordered_map<int, std::list<std::pair<int, int64_t>>::iterator> where_;
};

}  // namespace tessera
