#include "jit/device.hpp"

#include "dsl/element_count.hpp"

namespace tessera {

GemmShape gemm_shape(const Array& a, bool trans_a, const Array& out) {
  const auto& sa = a.shape_ref();
  const auto& so = out.shape_ref();
  const size_t r = sa.size();
  GemmShape s{so[r - 2], so[r - 1], trans_a ? sa[r - 2] : sa[r - 1], 1};
  for (size_t i = 0; i + 2 < r; ++i) s.batch *= sa[i];
  return s;
}

Array Device::new_array(std::vector<int64_t> shape, DType dtype) {
  const int64_t bytes = checked_element_count(shape, "Device::new_array") * dtype_size(dtype);
  std::shared_ptr<std::byte[]> memory = allocate(bytes);
  std::byte* data = memory.get();
  return view(std::move(memory), data, std::move(shape), dtype);
}

}  // namespace tessera
