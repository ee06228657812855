#include "dsl/tensor.hpp"

#include "dsl/concrete_value.hpp"
#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

namespace {

// The raw constructor takes components from the user: they must be what the layout says each
// local device holds, or a collective would fail much later with no hint of the cause.
void check_storage(const std::vector<int64_t>& shape, DType dtype, const Layout& layout, const ShardedStorage* storage) {
  const std::string what = "Tensor(shape " + shape_string(shape) + ", " + std::string(dtype_name(dtype)) + ", layout " +
                           (layout.is_valid() ? layout.specs_string() : "<empty>") + ")";
  if (!layout.is_valid()) throw LayoutError(what + ": the layout is an empty handle");
  if (!storage) throw Error(what + ": no storage given");
  if (int64_t(shape.size()) != layout.rank())
    throw LayoutError(what + ": a rank-" + std::to_string(shape.size()) + " shape cannot take a rank-" +
                      std::to_string(layout.rank()) + " layout");
  for (int64_t e : shape)
    if (e < 0) throw ShapeError(what + ": the shape has a negative extent");
  const Mesh& mesh = layout.mesh();
  const std::vector<int64_t> ids = mesh.local_device_ids();
  if (storage->components.size() != ids.size())
    throw LayoutError(what + ": got " + std::to_string(storage->components.size()) + " components for a mesh with " +
                      std::to_string(ids.size()) + " local devices (one component per device)");
  const std::vector<std::string> names = mesh.local_devices();
  for (size_t i = 0; i < ids.size(); ++i)
    if (storage->components[i].dtype() != dtype)
      throw DTypeError(what + ": component " + std::to_string(i) + " (device " + names[i] + ") is " +
                       std::string(dtype_name(storage->components[i].dtype())));
  check_component_shapes(storage->components, layout, shape, what);
}

}  // namespace

void check_component_shapes(const std::vector<Array>& components, const Layout& layout, const std::vector<int64_t>& shape,
                            std::string_view what) {
  const Mesh& mesh = layout.mesh();
  const std::vector<int64_t> ids = mesh.local_device_ids();
  const std::vector<std::string> names = mesh.local_devices();
  for (size_t i = 0; i < components.size(); ++i) {
    const std::vector<int64_t> expected = shard_geometry(shape, layout, mesh.coords(ids[i])).local_shape;
    if (components[i].shape() != expected)
      throw ShapeError(std::string(what) + ": component " + std::to_string(i) + " (device " + names[i] + ") has shape " +
                       shape_string(components[i].shape()) + " but the layout gives it " + shape_string(expected) +
                       " (layout " + layout.specs_string() + ", global shape " + shape_string(shape) + ")");
  }
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage) {
  check_storage(shape, dtype, layout, storage.get());
  node_ = make_leaf(std::move(shape), dtype, std::move(layout), std::move(storage));
}

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

std::vector<Array> Tensor::components() const {
  require_concrete(node(), "components()");
  return force_value(node()).storage->components;
}

}  // namespace tessera
