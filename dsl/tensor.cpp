#include "dsl/tensor.hpp"

namespace tessera {

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage)
    : node_(make_leaf(std::move(shape), dtype, std::move(layout), std::move(storage))) {}

const NodeRef& Tensor::node() const {
  if (!node_) throw Error("use of an empty Tensor handle (default-constructed)");
  return node_;
}

std::vector<int64_t> Tensor::shape() const { return node()->shape; }
DType Tensor::dtype() const { return node()->dtype; }
int64_t Tensor::rank() const { return node()->rank(); }
bool Tensor::is_computed() const { return node()->value().has_value(); }

Layout Tensor::layout() const {
  if (auto value = node()->value()) return value->layout;
  return planned_layout(node());
}

std::vector<Array> Tensor::components() const { return force_value(node()).storage->components; }

}  // namespace tessera
