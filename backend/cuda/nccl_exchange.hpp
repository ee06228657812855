// The host-side plan of an NCCL exchange: which elements a rank sends to and receives from each
// peer when a collective NCCL has no call for (uneven all_gather_v, all_to_all_v with run-time
// split sizes, uneven or rank-ordered reduce_scatter_v, all_to_all_regions) runs as one group of
// ncclSend/ncclRecv (backend/cuda/nccl_communicator.cpp). Pure arithmetic on counts, so it is
// tested without a GPU or NCCL (test_comm).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// `count` elements at `offset` elements into a buffer.
struct ExchangeBlock {
  int64_t offset = 0, count = 0;
  bool operator==(const ExchangeBlock&) const = default;
};

// What this rank sends to `peer` and receives from it.
struct PeerTransfer {
  int peer = 0;
  ExchangeBlock send, recv;
  bool operator==(const PeerTransfer&) const = default;
};

// Blocks of `counts` back to back in rank order (each offset the sum of the counts before it).
std::vector<ExchangeBlock> packed_blocks(std::span<const int64_t> counts);
// `ranks` blocks of `count` elements, back to back.
std::vector<ExchangeBlock> equal_blocks(int ranks, int64_t count);
// The same `count` elements at offset 0 for every rank (what all_gather_v sends each).
std::vector<ExchangeBlock> same_block(int ranks, int64_t count);

// The transfers of an exchange on `rank`: sends[p] to rank p and recvs[p] from it, in rank
// order, one per peer. A rank's transfer to itself must move as many elements as it receives:
// CommError naming `what` otherwise. Sizes of `sends` and `recvs` differing is an InternalError.
std::vector<PeerTransfer> exchange_transfers(int rank, std::span<const ExchangeBlock> sends, std::span<const ExchangeBlock> recvs,
                                             const char* what);

}  // namespace tessera
