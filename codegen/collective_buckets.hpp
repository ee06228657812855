// Collective buckets: small all_reduces over the same mesh dim (a model's bias and small weight
// gradients, the loss) each cost a collective's fixed latency and one more point where devices
// wait for each other. Like PyTorch DDP's gradient buckets, they run as one all_reduce of their
// concatenation.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/schedule.hpp"

namespace tessera {

// Members larger than this run alone: their bytes, not the latency, set their cost.
constexpr int64_t kBucketMemberMaximumBytes = 64 * 1024;

// Reorders `steps` so that each run of bucketable all_reduces becomes one step (its `outputs` are
// the members) placed where the last member was ready; the small steps that read a member's
// result, directly or through other such steps, move after it in their original order, and a
// large one closes the bucket where it stands, so no large work moves ahead of it. Every device
// (and every client) runs the same reordering, so collectives stay in the same order everywhere.
void bucket_small_all_reduces(const LocalProgram& program, std::vector<ScheduledStep>& steps);

}  // namespace tessera
