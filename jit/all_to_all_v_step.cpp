#include "jit/all_to_all_v_step.hpp"

#include <cstring>

#include "dsl/error.hpp"
#include "jit/device.hpp"

namespace tessera {

Array run_all_to_all_v_step(Communicator& comm, const Array& rows, std::span<const int64_t> counts,
                            const std::vector<int64_t>& out_shape, DType dtype, int64_t& received, Device* device,
                            const Array* into) {
  const int64_t n = comm.size(), me = comm.rank();
  if (int64_t(counts.size()) != n * n)
    throw InternalError("all_to_all_v: a counts matrix of " + std::to_string(counts.size()) + " entries for a group of " +
                        std::to_string(n));
  int64_t row_elements = 1;
  for (size_t a = 1; a < out_shape.size(); ++a) row_elements *= out_shape[a];
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  int64_t sent = 0, total = 0;
  for (int64_t r = 0; r < n; ++r) {
    send[size_t(r)] = counts[size_t(me * n + r)] * row_elements;
    recv[size_t(r)] = counts[size_t(r * n + me)] * row_elements;
    sent += send[size_t(r)];
    total += recv[size_t(r)];
  }
  // The graph zeroed the matrix unless every count and sum fits (dsl/all_to_all_v.cpp): a
  // breach here would overrun a buffer, so it is a bug, not bad input.
  if (sent > rows.numel() || total > out_shape.at(0) * row_elements)
    throw InternalError("all_to_all_v: " + std::to_string(sent) + " elements sent from " + std::to_string(rows.numel()) +
                        ", " + std::to_string(total) + " received into " + std::to_string(out_shape.at(0) * row_elements));
  const bool on_device = device && comm.memory_space() != MemorySpace::Host;
  Array out = into ? *into : on_device ? device->new_array(out_shape, dtype) : Array::uninitialized(out_shape, dtype);
  std::byte* out_bytes = on_device ? out.device_bytes() : out.mutable_bytes();
  const std::byte* in_bytes = on_device ? rows.device_bytes() : rows.bytes();
  comm.all_to_all_v(in_bytes, send, out_bytes, recv, dtype);
  const int64_t esize = dtype_size(dtype), tail = out.numel() - total;  // rows past the received ones are zero
  if (tail > 0) {
    if (on_device) device->fill(out_bytes + total * esize, tail, dtype, 0);
    else std::memset(out_bytes + total * esize, 0, size_t(tail * esize));
  }
  received = total - recv[size_t(me)];
  return out;
}

}  // namespace tessera
