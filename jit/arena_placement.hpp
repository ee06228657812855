// Where each value of an executable's arena goes (jit/memory_plan.hpp): largest first, each at
// the lowest offset clear of every value already placed whose lifetime overlaps its own. The
// values alive beside one are found through a segment tree over the steps, so placing n values
// costs O(n log n) plus the overlaps found, where scanning every placed value cost O(n^2): a
// pipelined plan with 16 microbatches holds tens of thousands of values.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

struct ArenaItem {
  int64_t size = 0;            // bytes
  int64_t begin = 0, end = 0;  // the steps it lives over, inclusive
};

struct ArenaPlacement {
  std::vector<int64_t> offset;  // per item, in the order given
  int64_t arena_bytes = 0;
};

// Items are placed in the order given (the caller sorts them); `steps` bounds every end.
ArenaPlacement place_in_arena(const std::vector<ArenaItem>& items, int64_t steps);

}  // namespace tessera
