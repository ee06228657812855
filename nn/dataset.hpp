// Training data: the IDX format of (Fashion-)MNIST, gzip-compressed or plain, and batches packed
// sharded over a mesh dimension (the tutorial's repack_batch).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dsl/tensor.hpp"

namespace tessera {

// An IDX file as a u8 array of its dimensions. IOError naming the file when it is missing,
// truncated, corrupt (bad gzip data or header) or not unsigned-byte data.
Array read_idx(const std::string& path);

struct Dataset {
  Array images;  // (N, rows * cols) float32 in [0, 1]
  Array labels;  // (N,) int32
  int64_t size() const { return labels.shape()[0]; }
};

// Loads the train or test split from `dir` (default: Debian's dataset-fashion-mnist), keeping
// the first `limit` examples when limit >= 0.
Dataset load_fashion_mnist(bool train, int64_t limit = -1, const std::string& dir = "/usr/share/datasets/fashion-mnist");

// Batches of a dataset in a shuffled order (from a seed and the epoch), packed as tensors sharded
// over `batch_dim`: images (B, features) with Layout::batch_sharded, labels (B,). The last batch
// keeps the remainder (uneven shards), it is never dropped.
class Batches {
 public:
  Batches(const Dataset& data, int64_t batch_size, Mesh mesh, std::string batch_dim, uint64_t seed);
  int64_t count() const;
  void shuffle(int64_t epoch);  // a new order for the epoch (the same for the same seed and epoch)
  std::pair<Tensor, Tensor> get(int64_t index) const;

 private:
  const Dataset& data_;
  int64_t batch_size_;
  Mesh mesh_;
  std::string dim_;
  uint64_t seed_;
  std::vector<int64_t> order_;
};

}  // namespace tessera
