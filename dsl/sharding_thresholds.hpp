// Below this size, splitting a value over devices does not pay: an extra collective's fixed
// latency (and one more point where devices wait for each other) costs more than the bytes and
// work it saves. Partial sums smaller than this are all_reduced rather than reduce_scattered,
// and optimizer state for smaller variables stays replicated.
#pragma once

#include <cstdint>

namespace tessera {

constexpr int64_t kShardingMinimumBytes = 256 * 1024;

}  // namespace tessera
