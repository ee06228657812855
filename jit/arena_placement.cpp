#include "jit/arena_placement.hpp"

#include <algorithm>
#include <map>

#include "dsl/error.hpp"

namespace tessera {
namespace {

// Placed items by lifetime: an item overlapping [begin, end] either contains `begin` (found by a
// stabbing query down the segment tree, where each item sits on the O(log steps) nodes that
// cover its lifetime) or begins inside (begin, end] (found in the map by begin).
class PlacedByLifetime {
 public:
  explicit PlacedByLifetime(int64_t steps) : steps_(std::max<int64_t>(steps, 1)), nodes_(size_t(4 * steps_)) {}

  void add(int item, int64_t begin, int64_t end) {
    insert(1, 0, steps_ - 1, begin, end, item);
    by_begin_.emplace(begin, item);
  }

  template <class Visit>
  void overlapping(int64_t begin, int64_t end, Visit visit) const {
    int64_t lo = 0, hi = steps_ - 1;
    for (size_t node = 1;;) {
      for (int item : nodes_[node]) visit(item);
      if (lo == hi) break;
      const int64_t mid = (lo + hi) / 2;
      if (begin <= mid) node = 2 * node, hi = mid;
      else node = 2 * node + 1, lo = mid + 1;
    }
    for (auto it = by_begin_.upper_bound(begin); it != by_begin_.end() && it->first <= end; ++it) visit(it->second);
  }

 private:
  void insert(size_t node, int64_t lo, int64_t hi, int64_t begin, int64_t end, int item) {
    if (end < lo || hi < begin) return;
    if (begin <= lo && hi <= end) {
      nodes_[node].push_back(item);
      return;
    }
    const int64_t mid = (lo + hi) / 2;
    insert(2 * node, lo, mid, begin, end, item);
    insert(2 * node + 1, mid + 1, hi, begin, end, item);
  }

  int64_t steps_;
  std::vector<std::vector<int>> nodes_;
  std::multimap<int64_t, int> by_begin_;
};

}  // namespace

ArenaPlacement place_in_arena(const std::vector<ArenaItem>& items, int64_t steps) {
  ArenaPlacement placement;
  placement.offset.assign(items.size(), -1);
  PlacedByLifetime placed(steps);
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of live neighbours
  for (size_t i = 0; i < items.size(); ++i) {
    const ArenaItem& item = items[i];
    if (item.begin < 0 || item.end < item.begin || item.end >= std::max<int64_t>(steps, 1))
      throw InternalError("place_in_arena: lifetime " + std::to_string(item.begin) + ".." + std::to_string(item.end) +
                          " outside the program's " + std::to_string(steps) + " steps");
    busy.clear();
    placed.overlapping(item.begin, item.end, [&](int other) {
      busy.push_back({placement.offset[size_t(other)], placement.offset[size_t(other)] + items[size_t(other)].size});
    });
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + item.size <= lo) break;
      at = std::max(at, hi);
    }
    placement.offset[i] = at;
    placement.arena_bytes = std::max(placement.arena_bytes, at + item.size);
    placed.add(int(i), item.begin, item.end);
  }
  return placement;
}

}  // namespace tessera
