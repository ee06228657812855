#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "comm/in_process_communicator.hpp"
#include "comm/reduce_kernels.hpp"
#include "dsl/error.hpp"

using namespace tessera;

namespace {

// Runs body(rank, communicator) on one thread per rank of a fresh group.
template <class Body>
void run_group(int size, Body body) {
  auto comms = create_in_process_group(size);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(size);
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, *comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

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

// Small integers per (rank, index) whose reductions are exact in every dtype.
double value_of(int rank, int64_t i) { return double((rank * 3 + i * 5) % 7) - 3.0; }

const DType kDTypes[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::f16};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min};

}  // namespace

TEST_CASE("all_reduce: every dtype and op, small and large, in and out of place") {
  for (int size : {1, 2, 3, 4})
    for (DType dtype : kDTypes)
      for (ReduceOp op : kOps)
        for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(20000)})
          for (bool in_place : {false, true}) {
            if (op == ReduceOp::Avg && (dtype == DType::i32 || dtype == DType::i64)) continue;  // tested below
            CAPTURE(size);
            CAPTURE(dtype_name(dtype));
            CAPTURE(reduce_op_name(op));
            CAPTURE(n);
            CAPTURE(in_place);
            std::vector<std::vector<double>> results(size);
            run_group(size, [&](int r, Communicator& c) {
              auto send = make(dtype, n, [&](int64_t i) { return value_of(r, i); });
              auto recv = in_place ? send : std::vector<std::byte>(send.size());
              c.all_reduce(send.data(), in_place ? send.data() : recv.data(), n, dtype, op);
              results[r] = read(in_place ? send : recv, dtype, n);
            });
            for (int r = 0; r < size; ++r)
              for (int64_t i = 0; i < n; i += 997) {
                std::vector<double> values;
                for (int p = 0; p < size; ++p) values.push_back(value_of(p, i));
                double want = combine(op, values);
                if (dtype == DType::bf16 || dtype == DType::f16) CHECK(results[r][i] == doctest::Approx(want).epsilon(0.01));
                else CHECK(results[r][i] == doctest::Approx(want));
              }
          }
}

TEST_CASE("integer avg truncates like integer division") {
  run_group(2, [&](int, Communicator& c) {
    int32_t v[2] = {3, -3};
    int32_t out[2];
    c.all_reduce(v, out, 2, DType::i32, ReduceOp::Avg);
    CHECK(out[0] == 3);
    CHECK(out[1] == -3);
  });
  std::vector<uint8_t> flags = {1, 0};
  run_group(2, [&](int r, Communicator& c) {
    uint8_t mine = flags[r], any = 0, all = 0;
    c.all_reduce(&mine, &any, 1, DType::u8, ReduceOp::Max);
    c.all_reduce(&mine, &all, 1, DType::u8, ReduceOp::Min);
    CHECK(any == 1);
    CHECK(all == 0);
  });
}

TEST_CASE("uneven all_gather_v, reduce_scatter_v, all_to_all_v, broadcast, barrier") {
  for (int size : {1, 2, 3, 5}) {
    CAPTURE(size);
    run_group(size, [&](int r, Communicator& c) {
      // Rank r contributes r + 1 values (rank counts 1, 2, 3, ...), one rank may send none.
      std::vector<int64_t> counts;
      for (int p = 0; p < size; ++p) counts.push_back(p == 1 ? 0 : p + 1);
      int64_t total = 0;
      for (int64_t n : counts) total += n;
      std::vector<int64_t> mine(counts[r]), gathered(total);
      for (int64_t i = 0; i < counts[r]; ++i) mine[i] = 100 * r + i;
      c.all_gather_v(mine.data(), counts[r], gathered.data(), counts, DType::i64);
      int64_t at = 0;
      for (int p = 0; p < size; ++p)
        for (int64_t i = 0; i < counts[p]; ++i) CHECK(gathered[at++] == 100 * p + i);

      // In place: this rank's block already lies at its place in the output.
      std::vector<int64_t> in_place(total, -1);
      int64_t own = 0;
      for (int p = 0; p < r; ++p) own += counts[p];
      std::copy(mine.begin(), mine.end(), in_place.begin() + own);
      c.all_gather_v(in_place.data() + own, counts[r], in_place.data(), counts, DType::i64);
      CHECK(in_place == gathered);

      std::vector<double> blocks(total), reduced(counts[r]);
      for (int64_t i = 0; i < total; ++i) blocks[i] = double(r + i);
      c.reduce_scatter_v(blocks.data(), reduced.data(), counts, DType::f64, ReduceOp::Sum);
      int64_t offset = 0;
      for (int p = 0; p < r; ++p) offset += counts[p];
      for (int64_t i = 0; i < counts[r]; ++i) CHECK(reduced[i] == double(size * (offset + i) + size * (size - 1) / 2));

      // all_to_all_v: rank r sends (r + p) % 3 values to rank p.
      std::vector<int64_t> send_counts, recv_counts;
      for (int p = 0; p < size; ++p) {
        send_counts.push_back((r + p) % 3);
        recv_counts.push_back((p + r) % 3);
      }
      std::vector<int32_t> send, recv(size * 3);
      for (int p = 0; p < size; ++p)
        for (int64_t i = 0; i < send_counts[p]; ++i) send.push_back(int32_t(1000 * r + 10 * p + i));
      c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::i32);
      at = 0;
      for (int p = 0; p < size; ++p)
        for (int64_t i = 0; i < recv_counts[p]; ++i) CHECK(recv[at++] == 1000 * p + 10 * r + i);

      float value[3] = {float(r), float(r), float(r)};
      c.broadcast(value, 3, DType::f32, size - 1);
      CHECK(value[2] == float(size - 1));
      c.barrier();

      std::vector<float> even(2), all(2 * size);
      even[0] = float(r);
      even[1] = float(-r);
      c.all_gather(even.data(), all.data(), 2, DType::f32);
      CHECK(all[2 * (size - 1) + 1] == float(-(size - 1)));
      std::vector<int32_t> rs(size * 2, 1), out(2);
      c.reduce_scatter(rs.data(), out.data(), 2, DType::i32, ReduceOp::Sum);
      CHECK(out[0] == size);
      std::vector<int32_t> a2a(size, r), b2b(size);
      c.all_to_all(a2a.data(), b2b.data(), 1, DType::i32);
      CHECK(b2b[size - 1] == size - 1);
    });
  }
}

// Rank r's rows (or columns) of a global rows x cols array whose element (i, j) is 100 i + j:
// torch.chunk blocks, uneven when the extent does not divide.
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

TEST_CASE("all_to_all_regions moves row blocks into column blocks, in place and through the packing default") {
  for (int size : {1, 2, 3, 4}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{6, 8}, {5, 7}, {2, 3}}) {
      CAPTURE(size);
      CAPTURE(rows);
      CAPTURE(cols);
      run_group(size, [&](int r, Communicator& c) {
        const ShardBox mine = block_of(rows, cols, size, r, 0), wanted = block_of(rows, cols, size, r, 1);
        std::vector<float> in(size_t(mine.num_elements()));
        for (int64_t i = 0; i < mine.local_shape[0]; ++i)
          for (int64_t j = 0; j < cols; ++j) in[size_t(i * cols + j)] = float(100 * (mine.global_offset[0] + i) + j);
        std::vector<ShardBox> send, recv;
        for (int p = 0; p < size; ++p) {
          send.push_back(overlap(mine, block_of(rows, cols, size, p, 1)));
          recv.push_back(overlap(block_of(rows, cols, size, p, 0), wanted));
        }
        const int64_t w = wanted.local_shape[1];
        std::vector<float> direct(size_t(std::max<int64_t>(wanted.num_elements(), 1)), -1.f), packed = direct;
        c.all_to_all_regions(in.data(), mine, send, direct.data(), wanted, recv, DType::f32);
        c.Communicator::all_to_all_regions(in.data(), mine, send, packed.data(), wanted, recv, DType::f32);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < w; ++j) {
            CHECK(direct[size_t(i * w + j)] == float(100 * i + wanted.global_offset[1] + j));
            CHECK(packed[size_t(i * w + j)] == direct[size_t(i * w + j)]);
          }
      });
    }
  }
}

TEST_CASE("all_to_all_regions that disagree raise CommError on every rank") {
  std::atomic<int> raised{0};
  run_group(2, [&](int r, Communicator& c) {
    const ShardBox mine = block_of(4, 4, 2, r, 0), wanted = block_of(4, 4, 2, r, 1);
    std::vector<ShardBox> send, recv;
    for (int p = 0; p < 2; ++p) {
      send.push_back(overlap(mine, block_of(4, 4, 2, p, 1)));
      recv.push_back(overlap(block_of(4, 4, 2, p, 0), wanted));
    }
    if (r == 1) recv[0].local_shape[0] = 1;  // rank 1 expects one row from rank 0, which sends two
    std::vector<float> in(8, 0.f), out(8);
    try {
      c.all_to_all_regions(in.data(), mine, send, out.data(), wanted, recv, DType::f32);
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("all_to_all_regions: rank 1 expects 2 elements from rank 0 but the group provides 4") !=
            std::string::npos);
      raised++;
    }
  });
  CHECK(raised == 2);
}

TEST_CASE("mismatched counts raise CommError on every rank, nobody hangs") {
  std::atomic<int> raised{0};
  run_group(3, [&](int r, Communicator& c) {
    std::vector<int64_t> recv_counts = {1, 1, r == 2 ? 2 : 1};
    int64_t mine[2] = {0, 0}, out[4];
    try {
      c.all_gather_v(mine, 1, out, recv_counts, DType::i64);
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("all_gather_v: rank 2 expects 2 elements from rank 2") != std::string::npos);
      raised++;
    }
    float x = 1, y;
    try {
      c.all_reduce(&x, &y, r == 0 ? 1 : 0, DType::f32, ReduceOp::Sum);
    } catch (const CommError&) {
      raised++;
    }
    c.barrier();  // still in step afterwards
  });
  CHECK(raised == 6);
  CHECK_THROWS_AS(create_in_process_group(0), CommError);
}
