// The agreement all_to_all_regions needs between its members: what each sender sends to each
// receiver is the region that receiver expects from it. Every member checks every pair after
// the members have published their regions, so a mismatch is found by all alike and nobody waits
// forever for a peer that threw.
#pragma once

#include <optional>

#include "dsl/shard_geometry.hpp"

namespace tessera {

struct RegionMismatch {
  int receiver = 0, sender = 0;
  int64_t expected = 0, got = 0;  // elements
};

// `sent(sender, receiver)` and `wanted(receiver, sender)` give the published regions.
template <class Sent, class Wanted>
std::optional<RegionMismatch> first_region_mismatch(int group_size, Sent sent, Wanted wanted) {
  for (int dst = 0; dst < group_size; ++dst)
    for (int src = 0; src < group_size; ++src) {
      const ShardBox& s = sent(src, dst);
      const ShardBox& w = wanted(dst, src);
      if (s.local_shape != w.local_shape || (s.num_elements() > 0 && s.global_offset != w.global_offset))
        return RegionMismatch{dst, src, w.num_elements(), s.num_elements()};
    }
  return std::nullopt;
}

}  // namespace tessera
