#include "collective_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dsl/array.hpp"
#include "dsl/error.hpp"

namespace tessera::testing {
namespace {

std::vector<double> read(const std::vector<std::byte>& buf, DType dtype, int64_t n) {
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(load_as_double(buf.data(), dtype, i));
  return out;
}

std::vector<std::byte> make(DType dtype, int64_t n, auto value) {
  std::vector<std::byte> buf(size_t(std::max<int64_t>(n, 1) * dtype_size(dtype)));
  for (int64_t i = 0; i < n; ++i) store_from_double(buf.data(), dtype, i, value(i));
  return buf;
}

double combine(ReduceOp op, const std::vector<double>& values) {
  double v = values[0];
  for (size_t i = 1; i < values.size(); ++i) {
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: v += values[i]; break;
      case ReduceOp::Product: v *= values[i]; break;
      case ReduceOp::Max: v = std::max(v, values[i]); break;
      case ReduceOp::Min: v = std::min(v, values[i]); break;
    }
  }
  return op == ReduceOp::Avg ? v / double(values.size()) : v;
}

double value_of(int rank, int64_t i) { return double((rank * 3 + i * 5) % 7) - 3.0; }

const DType kDTypes[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::f16};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min};

}  // namespace

void check_all_reduce(Communicator& c) {
  const int r = c.rank(), size = c.size();
  for (DType dtype : kDTypes)
    for (ReduceOp op : kOps)
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(20000), int64_t(300000)})
        for (bool in_place : {false, true}) {
          if (op == ReduceOp::Avg && (dtype == DType::i32 || dtype == DType::i64)) continue;  // below
          if (n > 20000 && op != ReduceOp::Sum && dtype != DType::f64) continue;            // keep it quick
          CAPTURE(size);
          CAPTURE(dtype_name(dtype));
          CAPTURE(reduce_op_name(op));
          CAPTURE(n);
          CAPTURE(in_place);
          auto send = make(dtype, n, [&](int64_t i) { return value_of(r, i); });
          auto recv = in_place ? send : std::vector<std::byte>(send.size());
          c.all_reduce(send.data(), in_place ? send.data() : recv.data(), n, dtype, op);
          const std::vector<double> got = read(in_place ? send : recv, dtype, n);
          bool all_right = true;
          for (int64_t i = 0; i < n; ++i) {
            std::vector<double> values;
            for (int p = 0; p < size; ++p) values.push_back(value_of(p, i));
            const double want = combine(op, values);
            const double relative = dtype == DType::bf16 || dtype == DType::f16 ? 0.01 : dtype == DType::f32 ? 1e-6 : 1e-12;
            const double tolerance = relative * std::max(1.0, std::abs(want));
            if (std::abs(got[size_t(i)] - want) > tolerance) {
              CHECK(got[size_t(i)] == doctest::Approx(want));
              all_right = false;
              break;
            }
          }
          CHECK(all_right);
        }
  int32_t v[2] = {3, -3}, out[2];
  c.all_reduce(v, out, 2, DType::i32, ReduceOp::Avg);  // integer avg truncates
  CHECK(out[0] == 3);
  CHECK(out[1] == -3);
  uint8_t mine = r == 0 ? 1 : 0, any = 0, all = 0;
  c.all_reduce(&mine, &any, 1, DType::u8, ReduceOp::Max);
  c.all_reduce(&mine, &all, 1, DType::u8, ReduceOp::Min);
  CHECK(any == 1);
  CHECK(all == (size == 1 ? 1 : 0));
}

void check_uneven_collectives(Communicator& c) {
  const int r = c.rank(), size = c.size();
  CAPTURE(size);
  for (int64_t scale : {int64_t(1), int64_t(100000)}) {  // 100,000 x 8 bytes: more than a 1 MiB slot
    CAPTURE(scale);
    // Rank p contributes (p + 1) * scale values; rank 1 none.
    std::vector<int64_t> counts;
    for (int p = 0; p < size; ++p) counts.push_back(p == 1 ? 0 : (p + 1) * scale);
    int64_t total = 0;
    for (int64_t n : counts) total += n;
    std::vector<int64_t> mine(static_cast<size_t>(counts[r])), gathered(static_cast<size_t>(total));
    for (int64_t i = 0; i < counts[r]; ++i) mine[size_t(i)] = 1000000 * r + i;
    c.all_gather_v(mine.data(), counts[r], gathered.data(), counts, DType::i64);
    int64_t at = 0;
    bool gathered_right = true;
    for (int p = 0; p < size; ++p)
      for (int64_t i = 0; i < counts[p]; ++i) gathered_right &= gathered[size_t(at++)] == 1000000 * p + i;
    CHECK(gathered_right);

    // In place: this rank's block already lies at its place in the output.
    std::vector<int64_t> in_place(static_cast<size_t>(total), -1);
    int64_t own = 0;
    for (int p = 0; p < r; ++p) own += counts[p];
    std::copy(mine.begin(), mine.end(), in_place.begin() + own);
    c.all_gather_v(in_place.data() + own, counts[r], in_place.data(), counts, DType::i64);
    CHECK(in_place == gathered);

    std::vector<double> blocks(static_cast<size_t>(total)), reduced(static_cast<size_t>(counts[r]));
    for (int64_t i = 0; i < total; ++i) blocks[size_t(i)] = double(r + i);
    c.reduce_scatter_v(blocks.data(), reduced.data(), counts, DType::f64, ReduceOp::Sum);
    bool reduced_right = true;
    for (int64_t i = 0; i < counts[r]; ++i) reduced_right &= reduced[size_t(i)] == double(size * (own + i) + size * (size - 1) / 2);
    CHECK(reduced_right);

    // all_to_all_v: rank r sends ((r + p) % 3) * scale values to rank p.
    std::vector<int64_t> send_counts, recv_counts;
    for (int p = 0; p < size; ++p) {
      send_counts.push_back(((r + p) % 3) * scale);
      recv_counts.push_back(((p + r) % 3) * scale);
    }
    std::vector<int32_t> send, recv(static_cast<size_t>(size * 3 * scale));
    for (int p = 0; p < size; ++p)
      for (int64_t i = 0; i < send_counts[p]; ++i) send.push_back(int32_t(1000 * r + 10 * p + i % 10));
    c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::i32);
    at = 0;
    bool exchanged_right = true;
    for (int p = 0; p < size; ++p)
      for (int64_t i = 0; i < recv_counts[p]; ++i) exchanged_right &= recv[size_t(at++)] == 1000 * p + 10 * r + i % 10;
    CHECK(exchanged_right);

    std::vector<float> value(static_cast<size_t>(3 * scale), float(r));
    c.broadcast(value.data(), 3 * scale, DType::f32, size - 1);
    CHECK(std::all_of(value.begin(), value.end(), [&](float x) { return x == float(size - 1); }));
    c.barrier();
  }
  std::vector<float> even = {float(r), float(-r)}, all(static_cast<size_t>(2 * size));
  c.all_gather(even.data(), all.data(), 2, DType::f32);
  CHECK(all[size_t(2 * (size - 1) + 1)] == float(-(size - 1)));
  std::vector<int32_t> ones(static_cast<size_t>(size * 2), 1), out(2);
  c.reduce_scatter(ones.data(), out.data(), 2, DType::i32, ReduceOp::Sum);
  CHECK(out[0] == size);
  std::vector<int32_t> a2a(static_cast<size_t>(size), r), b2b(static_cast<size_t>(size));
  c.all_to_all(a2a.data(), b2b.data(), 1, DType::i32);
  CHECK(b2b[size_t(size - 1)] == size - 1);
}

ShardBox block_of(int64_t rows, int64_t cols, int size, int r, int axis) {
  ChunkRange c = chunk_range(axis == 0 ? rows : cols, size, r);
  if (axis == 0) return {{c.length, cols}, {c.start, 0}};
  return {{rows, c.length}, {0, c.start}};
}

ShardBox overlap(const ShardBox& a, const ShardBox& b) {
  ShardBox o;
  for (size_t i = 0; i < 2; ++i) {
    int64_t lo = std::max(a.global_offset[i], b.global_offset[i]);
    int64_t hi = std::min(a.global_offset[i] + a.local_shape[i], b.global_offset[i] + b.local_shape[i]);
    o.global_offset.push_back(lo);
    o.local_shape.push_back(std::max<int64_t>(hi - lo, 0));
  }
  return o;
}

void check_all_to_all_regions(Communicator& c) {
  const int r = c.rank(), size = c.size();
  // Element (i, j) of the global array is 100 i + j (exact in float32 up to 2^24).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{6, 8}, {5, 7}, {2, 3}, {1200, 900}}) {
    CAPTURE(size);
    CAPTURE(rows);
    CAPTURE(cols);
    const ShardBox mine = block_of(rows, cols, size, r, 0), wanted = block_of(rows, cols, size, r, 1);
    std::vector<float> in(static_cast<size_t>(mine.num_elements()));
    for (int64_t i = 0; i < mine.local_shape[0]; ++i)
      for (int64_t j = 0; j < cols; ++j) in[size_t(i * cols + j)] = float(100 * (mine.global_offset[0] + i) + j);
    std::vector<ShardBox> send, recv;
    for (int p = 0; p < size; ++p) {
      send.push_back(overlap(mine, block_of(rows, cols, size, p, 1)));
      recv.push_back(overlap(block_of(rows, cols, size, p, 0), wanted));
    }
    const int64_t w = wanted.local_shape[1];
    std::vector<float> direct(static_cast<size_t>(std::max<int64_t>(wanted.num_elements(), 1)), -1.f), packed = direct;
    c.all_to_all_regions(in.data(), mine, send, direct.data(), wanted, recv, DType::f32);
    c.Communicator::all_to_all_regions(in.data(), mine, send, packed.data(), wanted, recv, DType::f32);
    bool right = true;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < w; ++j) right &= direct[size_t(i * w + j)] == float(100 * i + wanted.global_offset[1] + j);
    CHECK(right);
    CHECK(packed == direct);
  }
}

int check_mismatches_raise(Communicator& c) {
  const int r = c.rank(), last = c.size() - 1;
  int raised = 0;
  std::vector<int64_t> recv_counts(static_cast<size_t>(c.size()), 1);
  if (r == last) recv_counts[size_t(last)] = 2;  // the last rank expects 2 from itself, which sends 1
  int64_t mine[2] = {0, 0};
  std::vector<int64_t> out(static_cast<size_t>(c.size() + 1));
  try {
    c.all_gather_v(mine, 1, out.data(), recv_counts, DType::i64);
  } catch (const CommError& e) {
    const std::string want = "all_gather_v: rank " + std::to_string(last) + " expects 2 elements from rank " + std::to_string(last);
    CHECK(std::string(e.what()).find(want) != std::string::npos);
    raised++;
  }
  float x = 1, y;
  try {
    c.all_reduce(&x, &y, r == 0 ? 1 : 0, DType::f32, ReduceOp::Sum);
  } catch (const CommError&) {
    raised++;
  }
  c.barrier();  // still in step afterwards
  float z = 1, sum = 0;
  c.all_reduce(&z, &sum, 1, DType::f32, ReduceOp::Sum);
  CHECK(sum == float(c.size()));
  return raised;
}

}  // namespace tessera::testing
