#include "jit/device.hpp"

#include "dsl/element_count.hpp"

namespace tessera {

Array Device::new_array(std::vector<int64_t> shape, DType dtype) {
  const int64_t bytes = checked_element_count(shape, "Device::new_array") * dtype_size(dtype);
  std::shared_ptr<std::byte[]> memory = allocate(bytes);
  std::byte* data = memory.get();
  return view(std::move(memory), data, std::move(shape), dtype);
}

}  // namespace tessera
