#include "dsl/array.hpp"

#include <cstring>
#include <mutex>
#include <new>

#include "dsl/buffer_pool.hpp"
#include "dsl/memory_counter.hpp"
#include "dsl/element_count.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
Array::Array(std::vector<int64_t> shape, DType dtype) : Array(std::move(shape), dtype, true) {}

Array::Array(std::vector<int64_t> shape, DType dtype, bool zero_fill) : shape_(std::move(shape)), dtype_(dtype) {
  checked_element_count(shape_, "Array");
  buffer_ = allocate_buffer(nbytes(), zero_fill);
}

Array Array::uninitialized(std::vector<int64_t> shape, DType dtype) { return Array(std::move(shape), dtype, false); }

int64_t Array::numel() const { return element_count(shape_); }

double Array::element_as_double(int64_t i) const { return load_as_double(bytes(), dtype_, i); }

Array Array::view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape, DType dtype) {
  Array out;
  out.shape_ = std::move(shape);
  out.dtype_ = dtype;
  out.buffer_ = std::shared_ptr<std::byte[]>(std::move(owner), data);  // aliasing: shares ownership
  return out;
}

// A device array's host copy, made on the first host read and shared by the array's copies
// (device arrays are values: nothing writes them after the kernel that produced them).
struct Array::HostMirror {
  DeviceDownload download;
  std::once_flag once;
  std::shared_ptr<std::byte[]> host;
};

Array Array::device_view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape, DType dtype,
                         MemorySpace space, DeviceDownload download) {
  Array out = view(std::move(owner), data, std::move(shape), dtype);
  out.memory_space_ = space;
  if (space != MemorySpace::Host) {
    out.mirror_ = std::make_shared<HostMirror>();
    out.mirror_->download = std::move(download);
  }
  return out;
}

Array Array::subview(int64_t byte_offset, std::vector<int64_t> shape) const {
  Array out = memory_space_ == MemorySpace::Host
                  ? view(buffer_, buffer_.get() + byte_offset, std::move(shape), dtype_)
                  : device_view(buffer_, buffer_.get() + byte_offset, std::move(shape), dtype_, memory_space_, mirror_->download);
  out.device_ = device_;  // a part of the block lives where the block does
  return out;
}

Array Array::charged_to(MemoryCounter& counter) const {
  Array out = *this;
  out.buffer_ = charged(buffer_, nbytes(), counter);
  return out;
}

const std::byte* Array::host_mirror() const {
  HostMirror& m = *mirror_;
  std::call_once(m.once, [&] {
    m.host = allocate_buffer(nbytes(), false);
    if (nbytes() > 0) m.download(buffer_.get(), m.host.get(), nbytes());
  });
  return m.host.get();
}

void Array::throw_device_write() const {
  throw InternalError(std::string("an array in ") + std::string(memory_space_name(memory_space_)) +
                      " memory is written on the host; clone() it to a host array first");
}

Array Array::clone() const {
  Array out(shape_, dtype_, false);
  std::memcpy(out.mutable_bytes(), bytes(), size_t(nbytes()));
  out.device_ = device_;
  return out;
}

Array Array::on_device(std::string device) const {
  Array out = *this;
  out.device_ = std::move(device);
  return out;
}

void copy_region(const Array& src, const std::vector<int64_t>& src_offset, Array& dst,
                 const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                 const std::vector<int64_t>& region_shape) {
  if (src.dtype() != dst.dtype()) throw InternalError("copy_region: dtypes differ");
  copy_region(BlockRef{src.bytes(), src.shape_ref(), src_offset}, dst.mutable_bytes(), dst.shape_ref(), dst_offset,
              region_offset, region_shape, dtype_size(src.dtype()));
}

void copy_region(BlockRef src, std::byte* dst_data, const std::vector<int64_t>& ds,
                 const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                 const std::vector<int64_t>& region_shape, int64_t esize) {
  const int64_t rank = int64_t(region_shape.size());
  const std::vector<int64_t>& src_offset = src.offset;
  for (int64_t e : region_shape)
    if (e == 0) return;
  if (rank == 0) {
    std::memcpy(dst_data, src.data, size_t(esize));
    return;
  }
  const auto& ss = src.shape;
  // Element strides, and the start of the region in each block.
  std::vector<int64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (int64_t a = rank - 2; a >= 0; --a) {
    src_stride[a] = src_stride[a + 1] * ss[a + 1];
    dst_stride[a] = dst_stride[a + 1] * ds[a + 1];
  }
  // Merge trailing axes that are whole in both blocks into one contiguous run.
  int64_t run_axis = rank - 1;
  int64_t run = region_shape[run_axis];
  while (run_axis > 0 && region_shape[run_axis] == ss[run_axis] && region_shape[run_axis] == ds[run_axis]) {
    --run_axis;
    run *= region_shape[run_axis];
  }
  int64_t src_base = 0, dst_base = 0;
  for (int64_t a = 0; a < rank; ++a) {
    src_base += (region_offset[a] - src_offset[a]) * src_stride[a];
    dst_base += (region_offset[a] - dst_offset[a]) * dst_stride[a];
  }
  const std::byte* s = src.data;
  std::byte* d = dst_data;
  std::vector<int64_t> index(run_axis, 0);  // odometer over the axes before run_axis
  while (true) {
    int64_t so = src_base, dof = dst_base;
    for (int64_t a = 0; a < run_axis; ++a) {
      so += index[a] * src_stride[a];
      dof += index[a] * dst_stride[a];
    }
    std::memcpy(d + dof * esize, s + so * esize, size_t(run * esize));
    int64_t a = run_axis - 1;
    while (a >= 0 && ++index[a] == region_shape[a]) index[a--] = 0;
    if (a < 0) return;
  }
}

}  // namespace tessera
