// Checks of every collective that any backend runs, called by each rank of a group with its own
// communicator: by threads for in-process groups (test_comm), by processes under mpirun for the
// MPI and shared-memory backends (test_mpi). Values are small integers per (rank, index), so
// every reduction is exact in every dtype and the expected result is computed directly.
#pragma once

#include "comm/communicator.hpp"
#include "dsl/shard_geometry.hpp"

namespace tessera::testing {

// all_reduce: every dtype and op, 0 to 300,000 elements (several shared-memory rounds), in and
// out of place; integer avg truncates; bool max / min are any / all.
void check_all_reduce(Communicator& c);

// Uneven all_gather_v (in and out of place), reduce_scatter_v, all_to_all_v and broadcast,
// small and larger than a shared-memory slot, plus the even variants and barrier.
void check_uneven_collectives(Communicator& c);

// all_to_all_regions turning row blocks into column blocks (even and uneven, and one exchange
// larger than a shared-memory slot), checked against the values and against the packing default.
void check_all_to_all_regions(Communicator& c);

// Rank r's rows (axis 0) or columns (axis 1) of a rows x cols array: torch.chunk blocks.
ShardBox block_of(int64_t rows, int64_t cols, int size, int r, int axis);
// The overlap of two 2-D boxes (empty extents where they do not meet).
ShardBox overlap(const ShardBox& a, const ShardBox& b);

// Counts that disagree between ranks raise CommError on every rank, and the group stays in
// step. Returns how many CommErrors this rank saw (2 expected).
int check_mismatches_raise(Communicator& c);

}  // namespace tessera::testing
