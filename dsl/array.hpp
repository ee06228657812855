// Array: a dense row-major tensor on one device (host memory for CPU devices). Copies share the
// buffer (like a Python reference); clone() copies the data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "dsl/dtype.hpp"
#include "dsl/memory_space.hpp"
#include "dsl/error.hpp"

namespace tessera {

struct MemoryCounter;  // dsl/memory_counter.hpp

class Array {
 public:
  Array() : Array(std::vector<int64_t>{0}, DType::f32) {}
  Array(std::vector<int64_t> shape, DType dtype);  // zero-filled
  static Array uninitialized(std::vector<int64_t> shape, DType dtype);

  template <class T>
  static Array from(std::vector<T> data, std::vector<int64_t> shape);
  template <class T>
  static Array scalar(T value) { return from<T>({value}, {}); }

  // Nested braces: Array{1, 2}, Array{{1, 2}, {3, 4}}, Array{{{1.5f}}}.
  // Integers become int32, floating values float32 (as tf.constant does), bools bool.
  template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
  Array(std::initializer_list<T> values) { init_nested(values); }
  template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
  Array(std::initializer_list<std::initializer_list<T>> values) { init_nested(values); }
  template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
  Array(std::initializer_list<std::initializer_list<std::initializer_list<T>>> values) { init_nested(values); }

  std::vector<int64_t> shape() const { return shape_; }
  const std::vector<int64_t>& shape_ref() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::string device() const { return device_; }
  // Host for every Array made here; device buffers are made by a Device (jit/device.hpp). A
  // device array is read on the host through bytes() and data(), which copy it to a host mirror
  // once (ordered after the device's queued work); it is never written through them.
  MemorySpace memory_space() const { return memory_space_; }
  int64_t rank() const { return int64_t(shape_.size()); }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }

  template <class T>
  std::vector<T> to_vector() const;
  double element_as_double(int64_t flat_index) const;

  // A view of `shape` at `data`, keeping `owner` alive (arena-backed values of executables).
  static Array view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape, DType dtype);
  // Copies `bytes` of device memory at `device` to `host`, after the device's queued work.
  using DeviceDownload = std::function<void(const std::byte* device, std::byte* host, int64_t bytes)>;
  // The same over device memory in `space`, read on the host through `download`.
  static Array device_view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape,
                           DType dtype, MemorySpace space, DeviceDownload download);
  // A view of `shape` starting `byte_offset` bytes into this array's buffer, sharing ownership.
  Array subview(int64_t byte_offset, std::vector<int64_t> shape) const;
  Array clone() const;  // a host copy, whatever the memory space
  Array on_device(std::string device) const;  // same buffer, another device name
  // The same view, its nbytes() charged to `counter` while it or a copy lives (memory_stats:
  // a tensor's components, made on the host, adopted by their devices).
  Array charged_to(MemoryCounter& counter) const;
  bool shares_buffer_with(const Array& other) const { return buffer_ == other.buffer_; }
  // No other Array (a copy, a view, a subview) holds this one's buffer.
  bool owns_buffer_alone() const { return buffer_.use_count() == 1; }

  // Host memory: the buffer itself, or a device array's host mirror (read-only).
  const std::byte* bytes() const { return memory_space_ == MemorySpace::Host ? buffer_.get() : host_mirror(); }
  std::byte* mutable_bytes() {
    if (memory_space_ != MemorySpace::Host) throw_device_write();
    return buffer_.get();
  }
  template <class T> const T* data() const { return reinterpret_cast<const T*>(bytes()); }
  template <class T> T* mutable_data() { return reinterpret_cast<T*>(mutable_bytes()); }
  // The buffer in its own memory space: what a Device passes to its kernels and copies.
  std::byte* device_bytes() const { return buffer_.get(); }

 private:
  Array(std::vector<int64_t> shape, DType dtype, bool zero_fill);
  template <class T> static constexpr DType brace_dtype() {
    if constexpr (std::is_same_v<T, bool>) return DType::u8;
    else if constexpr (std::is_floating_point_v<T>) return DType::f32;
    else return DType::i32;
  }
  template <class T> void init_nested(std::initializer_list<T> values);
  template <class T> void init_nested(std::initializer_list<std::initializer_list<T>> values);
  template <class T> void init_nested(std::initializer_list<std::initializer_list<std::initializer_list<T>>> values);
  template <class T> void fill_from_doubles(const std::vector<double>& values, std::vector<int64_t> shape);
  const std::byte* host_mirror() const;
  [[noreturn]] void throw_device_write() const;
  struct HostMirror;

  std::vector<int64_t> shape_;
  DType dtype_ = DType::f32;
  std::string device_ = "CPU:0";
  MemorySpace memory_space_ = MemorySpace::Host;
  std::shared_ptr<std::byte[]> buffer_;
  std::shared_ptr<HostMirror> mirror_;  // device arrays only
};

// Copies the global-coordinate region [region_offset, region_offset + region_shape) from `src`
// (whose block starts at src_offset in global coordinates) into `dst` (block at dst_offset).
// Both arrays have the same dtype and rank; the region must lie inside both blocks.
void copy_region(const Array& src, const std::vector<int64_t>& src_offset, Array& dst,
                 const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                 const std::vector<int64_t>& region_shape);

// The same on raw blocks (packed exchange buffers): a block is data + shape + global offset.
struct BlockRef {
  const std::byte* data;
  const std::vector<int64_t>& shape;
  const std::vector<int64_t>& offset;
};
void copy_region(BlockRef src, std::byte* dst, const std::vector<int64_t>& dst_shape,
                 const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                 const std::vector<int64_t>& region_shape, int64_t element_size);

// ---- template definitions ----

template <class T>
Array Array::from(std::vector<T> data, std::vector<int64_t> shape) {
  Array out(shape, dtype_of<T>(), false);
  if (int64_t(data.size()) != out.numel())
    throw ShapeError("Array::from: " + std::to_string(data.size()) + " values do not fill shape with " +
                     std::to_string(out.numel()) + " elements");
  if constexpr (std::is_same_v<T, bool>) {
    for (size_t i = 0; i < data.size(); ++i) out.mutable_data<uint8_t>()[i] = data[i];
  } else {
    std::copy(data.begin(), data.end(), out.mutable_data<T>());
  }
  return out;
}

template <class T>
std::vector<T> Array::to_vector() const {
  if (dtype_of<T>() != dtype_)
    throw DTypeError("Array::to_vector: the array holds " + std::string(dtype_name(dtype_)) +
                     ", not " + std::string(dtype_name(dtype_of<T>())));
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<bool> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = data<uint8_t>()[i] != 0;
    return out;
  } else {
    return std::vector<T>(data<T>(), data<T>() + numel());
  }
}

template <class T>
void Array::fill_from_doubles(const std::vector<double>& values, std::vector<int64_t> shape) {
  *this = Array(std::move(shape), brace_dtype<T>(), false);
  for (size_t i = 0; i < values.size(); ++i) store_from_double(mutable_bytes(), dtype_, int64_t(i), values[i]);
}

template <class T>
void Array::init_nested(std::initializer_list<T> values) {
  std::vector<double> flat(values.begin(), values.end());
  fill_from_doubles<T>(flat, {int64_t(values.size())});
}

template <class T>
void Array::init_nested(std::initializer_list<std::initializer_list<T>> values) {
  std::vector<double> flat;
  int64_t inner = values.size() ? int64_t(values.begin()->size()) : 0;
  for (const auto& row : values) {
    if (int64_t(row.size()) != inner) throw ShapeError("nested braces: rows have different lengths (ragged array)");
    flat.insert(flat.end(), row.begin(), row.end());
  }
  fill_from_doubles<T>(flat, {int64_t(values.size()), inner});
}

template <class T>
void Array::init_nested(std::initializer_list<std::initializer_list<std::initializer_list<T>>> values) {
  std::vector<double> flat;
  int64_t mid = values.size() ? int64_t(values.begin()->size()) : 0;
  int64_t inner = mid ? int64_t(values.begin()->begin()->size()) : 0;
  for (const auto& plane : values) {
    if (int64_t(plane.size()) != mid) throw ShapeError("nested braces: planes have different row counts (ragged array)");
    for (const auto& row : plane) {
      if (int64_t(row.size()) != inner) throw ShapeError("nested braces: rows have different lengths (ragged array)");
      flat.insert(flat.end(), row.begin(), row.end());
    }
  }
  fill_from_doubles<T>(flat, {int64_t(values.size()), mid, inner});
}

}  // namespace tessera
