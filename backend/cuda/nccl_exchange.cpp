#include "backend/cuda/nccl_exchange.hpp"

#include <fmt/format.h>

#include "dsl/error.hpp"

namespace tessera {

std::vector<ExchangeBlock> packed_blocks(std::span<const int64_t> counts) {
  std::vector<ExchangeBlock> blocks;
  int64_t offset = 0;
  for (int64_t count : counts) {
    blocks.push_back({offset, count});
    offset += count;
  }
  return blocks;
}

std::vector<ExchangeBlock> equal_blocks(int ranks, int64_t count) {
  std::vector<ExchangeBlock> blocks;
  for (int p = 0; p < ranks; ++p) blocks.push_back({int64_t(p) * count, count});
  return blocks;
}

std::vector<ExchangeBlock> same_block(int ranks, int64_t count) { return std::vector<ExchangeBlock>(size_t(ranks), {0, count}); }

std::vector<PeerTransfer> exchange_transfers(int rank, std::span<const ExchangeBlock> sends, std::span<const ExchangeBlock> recvs,
                                             const char* what) {
  if (sends.size() != recvs.size())
    throw InternalError(fmt::format("{}: {} send blocks and {} receive blocks", what, sends.size(), recvs.size()));
  std::vector<PeerTransfer> transfers;
  for (size_t p = 0; p < sends.size(); ++p) {
    if (int(p) == rank && sends[p].count != recvs[p].count)
      throw CommError(fmt::format("{}: rank {} sends {} elements to itself but expects {}", what, rank, sends[p].count, recvs[p].count));
    transfers.push_back({int(p), sends[p], recvs[p]});
  }
  return transfers;
}

}  // namespace tessera
