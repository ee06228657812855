#include "dsl/tensor.hpp"

namespace tessera {

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage)
    : impl_(std::make_shared<Impl>(Impl{std::move(shape), dtype, std::move(layout), std::move(storage)})) {}

const Tensor::Impl& Tensor::impl() const {
  if (!impl_) throw Error("use of an empty Tensor handle (default-constructed)");
  return *impl_;
}

std::vector<int64_t> Tensor::shape() const { return impl().shape; }
DType Tensor::dtype() const { return impl().dtype; }
Layout Tensor::layout() const { return impl().layout; }
int64_t Tensor::rank() const { return int64_t(impl().shape.size()); }
const std::vector<Array>& Tensor::components() const { return impl().storage->components; }

}  // namespace tessera
