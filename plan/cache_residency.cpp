#include "plan/cache_residency.hpp"

namespace tessera {

int64_t CacheResidency::touch(const std::vector<std::pair<int, int64_t>>& reads, const std::vector<std::pair<int, int64_t>>& writes) {
  if (capacity_ <= 0) return 0;
  int64_t found = 0;
  for (const auto& [value, bytes] : reads)
    if (where_.count(value)) found += bytes;
  // A written value goes to the cache as it is written, where it fits.
  for (const auto& [value, bytes] : writes)
    if (bytes <= capacity_) found += bytes;
  for (const auto& [value, bytes] : reads) make_recent(value, bytes);
  for (const auto& [value, bytes] : writes) make_recent(value, bytes);
  return found;
}

void CacheResidency::make_recent(int value, int64_t bytes) {
  if (auto it = where_.find(value); it != where_.end()) {
    held_ -= it->second->second;
    recent_.erase(it->second);
    where_.erase(it);
  }
  if (bytes > capacity_) return;  // streams through without staying
  recent_.emplace_front(value, bytes);
  where_[value] = recent_.begin();
  held_ += bytes;
  while (held_ > capacity_) {
    held_ -= recent_.back().second;
    where_.erase(recent_.back().first);
    recent_.pop_back();
  }
}

}  // namespace tessera
