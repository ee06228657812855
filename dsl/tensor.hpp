// Tensor: a DTensor. Global shape, dtype and layout, plus the components (one Array per local
// device) that hold its value. The value lives in ShardedStorage, kept apart from the handle so
// that a lazily computed Tensor (a graph node) can later own the same kind of storage.
// Members that must run something (redistribute, full_tensor) are defined in jit/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsl/array.hpp"
#include "dsl/layout.hpp"

namespace tessera {

// The materialised value of a tensor: component i belongs to the mesh's local device i.
struct ShardedStorage {
  std::vector<Array> components;
};

class Tensor {
 public:
  Tensor() = default;  // an empty handle; only assignable
  // Takes ownership of components already laid out per `layout` (checked by the caller).
  Tensor(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage);

  std::vector<int64_t> shape() const;
  DType dtype() const;
  Layout layout() const;
  int64_t rank() const;
  bool is_valid() const { return impl_ != nullptr; }

  Tensor redistribute(std::vector<Placement> placements) const;  // PyTorch spelling of relayout
  Array to_local() const;      // this client's component (first local device)
  Array full_tensor() const;   // gathers; works for every layout

  const std::vector<Array>& components() const;  // internal: one per local device

 private:
  struct Impl {
    std::vector<int64_t> shape;
    DType dtype;
    Layout layout;
    std::shared_ptr<const ShardedStorage> storage;
  };
  const Impl& impl() const;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tessera
