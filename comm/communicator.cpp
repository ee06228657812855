#include "comm/communicator.hpp"

#include <vector>

namespace tessera {

void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  std::vector<int64_t> counts(size(), count);
  all_gather_v(send, count, recv, counts, dtype);
}

void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  std::vector<int64_t> counts(size(), count);
  reduce_scatter_v(send, recv, counts, dtype, op);
}

void Communicator::all_to_all(const void* send, void* recv, int64_t count, DType dtype) {
  std::vector<int64_t> counts(size(), count);
  all_to_all_v(send, counts, recv, counts, dtype);
}

}  // namespace tessera
