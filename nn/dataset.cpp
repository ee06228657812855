#include "nn/dataset.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "dsl/element_count.hpp"
#include "dsl/string_util.hpp"
#include "jit/api/tensor_api.hpp"

namespace tessera {
namespace {

struct GzFile {
  gzFile file;
  ~GzFile() {
    if (file) gzclose(file);
  }
};

}  // namespace

Array read_idx(const std::string& path) {
  GzFile f{gzopen(path.c_str(), "rb")};  // reads plain files too
  if (!f.file) throw IOError("cannot open IDX file '" + path + "': " + std::strerror(errno));
  auto read_exact = [&](void* dst, unsigned bytes, const char* what) {
    int got = gzread(f.file, dst, bytes);
    if (got < 0) {
      int code = 0;
      throw IOError("IDX file '" + path + "' is corrupt (" + gzerror(f.file, &code) + ") while reading " + what);
    }
    if (unsigned(got) != bytes)
      throw IOError("IDX file '" + path + "' is truncated: " + what + " needs " + std::to_string(bytes) + " bytes, got " +
                    std::to_string(got));
  };
  uint8_t header[4];
  read_exact(header, 4, "the header");
  if (header[0] != 0 || header[1] != 0) throw IOError("IDX file '" + path + "' has a bad magic number (not IDX data)");
  if (header[2] != 0x08)
    throw IOError(fmt::format("IDX file '{}' holds element type 0x{:02x}; only unsigned bytes (0x08) are supported", path, header[2]));
  const int ndims = header[3];
  if (ndims < 1 || ndims > 4) throw IOError("IDX file '" + path + "' claims " + std::to_string(ndims) + " dimensions");
  std::vector<int64_t> shape;
  for (int d = 0; d < ndims; ++d) {
    uint8_t b[4];
    read_exact(b, 4, "the dimensions");
    shape.push_back(int64_t(b[0]) << 24 | int64_t(b[1]) << 16 | int64_t(b[2]) << 8 | int64_t(b[3]));
  }
  int64_t total = 1;
  for (int64_t e : shape) {
    if (e != 0 && total > kMaxElements / e)
      throw IOError("IDX file '" + path + "' claims dimensions " + shape_string(shape) + ", more elements than any tensor may have");
    total *= e;
  }
  // Read in pieces before trusting the header's size: a corrupt header claiming gigabytes fails
  // as truncated after reading what is there, instead of allocating what it claims first. The
  // pieces double from 64 KiB (to 64 MiB), so a short file costs about its own size.
  std::vector<uint8_t> data;
  constexpr int64_t kFirstPiece = int64_t(1) << 16, kMaxPiece = int64_t(1) << 26;
  while (int64_t(data.size()) < total) {
    const int64_t piece = std::min({total - int64_t(data.size()), std::max(kFirstPiece, int64_t(data.size())), kMaxPiece});
    const size_t at = data.size();
    data.resize(at + size_t(piece));
    read_exact(data.data() + at, unsigned(piece), "the data");
  }
  Array out = Array::uninitialized(shape, DType::u8);
  if (total > 0) std::memcpy(out.mutable_bytes(), data.data(), size_t(total));
  return out;
}

Dataset load_fashion_mnist(bool train, int64_t limit, const std::string& dir) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images_file = prefix + "-images-idx3-ubyte.gz", labels_file = prefix + "-labels-idx1-ubyte.gz";
  Array images = read_idx(images_file);
  Array labels = read_idx(labels_file);
  // Each header on its own first: a count mismatch between files of the wrong ranks would name
  // numbers that mean nothing.
  if (images.rank() != 3)
    throw IOError("IDX images file '" + images_file + "' has rank " + std::to_string(images.rank()) + ", shape " +
                  shape_string(images.shape()) + "; expected rank 3 (n, rows, cols)");
  if (labels.rank() != 1)
    throw IOError("IDX labels file '" + labels_file + "' has rank " + std::to_string(labels.rank()) + ", shape " +
                  shape_string(labels.shape()) + "; expected rank 1 (n,)");
  if (images.shape()[0] != labels.shape()[0])
    throw IOError("IDX images file '" + images_file + "' holds " + std::to_string(images.shape()[0]) +
                  " images but labels file '" + labels_file + "' holds " + std::to_string(labels.shape()[0]) + " labels");
  // No image may have more pixels than a tensor may hold elements: with no images, read_idx
  // accepts any extents, and rows * cols could overflow.
  const int64_t rows = images.shape()[1], cols = images.shape()[2];
  if (rows != 0 && cols > kMaxElements / rows)
    throw IOError("'" + images_file + "' claims images of " + std::to_string(rows) + " x " + std::to_string(cols) +
                  " pixels, more than any tensor may hold");
  int64_t n = images.shape()[0];
  if (limit >= 0) n = std::min(n, limit);
  const int64_t features = rows * cols;
  Dataset d{Array::uninitialized({n, features}, DType::f32), Array::uninitialized({n}, DType::i32)};
  for (int64_t i = 0; i < n * features; ++i) d.images.mutable_data<float>()[i] = float(images.data<uint8_t>()[i]) / 255.0f;
  for (int64_t i = 0; i < n; ++i) d.labels.mutable_data<int32_t>()[i] = labels.data<uint8_t>()[i];
  return d;
}

Batches::Batches(const Dataset& data, int64_t batch_size, Mesh mesh, std::string batch_dim, uint64_t seed)
    : data_(data), batch_size_(batch_size), mesh_(std::move(mesh)), dim_(std::move(batch_dim)), seed_(seed) {
  if (batch_size_ < 1) throw ShapeError("Batches: batch size " + std::to_string(batch_size_) + " must be at least 1");
  if (!mesh_.contains_dim(dim_)) throw LayoutError("Batches: the mesh has no dimension '" + dim_ + "'");
  order_.resize(size_t(data_.size()));
  std::iota(order_.begin(), order_.end(), 0);
}

int64_t Batches::count() const { return (data_.size() + batch_size_ - 1) / batch_size_; }

void Batches::shuffle(int64_t epoch) {
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(seed_ * 1000003 + uint64_t(epoch));
  std::shuffle(order_.begin(), order_.end(), rng);
}

std::pair<Tensor, Tensor> Batches::get(int64_t index) const {
  const int64_t begin = index * batch_size_, end = std::min(begin + batch_size_, data_.size());
  if (index < 0 || begin >= end) throw ShapeError("Batches: batch " + std::to_string(index) + " of " + std::to_string(count()));
  const int64_t rows = end - begin, features = data_.images.shape()[1];
  // Each device gathers only its own rows (under MPI, each client only its devices' rows).
  auto gather_rows = [&](const Array& source, const ShardBox& box) {
    const bool matrix = box.local_shape.size() > 1;
    const int64_t width = matrix ? box.local_shape[1] : 1, row_length = matrix ? source.shape()[1] : 1;
    const int64_t first_column = matrix ? box.global_offset[1] : 0, esize = dtype_size(source.dtype());
    Array out = Array::uninitialized(box.local_shape, source.dtype());
    for (int64_t r = 0; r < box.local_shape[0]; ++r) {
      const int64_t example = order_[size_t(begin + box.global_offset[0] + r)];
      std::memcpy(out.mutable_bytes() + r * width * esize, source.bytes() + (example * row_length + first_column) * esize,
                  size_t(width * esize));
    }
    return out;
  };
  return {make_tensor_from_callback({rows, features}, Layout::batch_sharded(mesh_, dim_, 2),
                                    [&](const ShardBox& box) { return gather_rows(data_.images, box); }),
          make_tensor_from_callback({rows}, Layout::batch_sharded(mesh_, dim_, 1),
                                    [&](const ShardBox& box) { return gather_rows(data_.labels, box); })};
}

}  // namespace tessera
