#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "collective_checks.hpp"
#include "backend/cuda/nccl_exchange.hpp"
#include "comm/in_process_communicator.hpp"
#include "comm/reduce_kernels.hpp"
#include "dsl/error.hpp"

using namespace tessera;
using namespace tessera::testing;

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

}  // namespace

TEST_CASE("all_reduce: every dtype and op, small and large, in and out of place") {
  for (int size : {1, 2, 3, 4}) run_group(size, [](int, Communicator& c) { check_all_reduce(c); });
}

TEST_CASE("uneven all_gather_v, reduce_scatter_v, all_to_all_v, broadcast, barrier") {
  for (int size : {1, 2, 3, 5}) run_group(size, [](int, Communicator& c) { check_uneven_collectives(c); });
}

TEST_CASE("all_to_all_regions moves row blocks into column blocks, in place and through the packing default") {
  for (int size : {1, 2, 3, 4}) run_group(size, [](int, Communicator& c) { check_all_to_all_regions(c); });
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
  run_group(3, [&](int, Communicator& c) { raised += check_mismatches_raise(c); });
  CHECK(raised == 6);
  CHECK_THROWS_AS(create_in_process_group(0), CommError);
}

TEST_CASE("in-process group buffers: every rank's n-th buffer is the same memory") {
  for (int size : {1, 2, 3}) {
    std::vector<std::byte*> first(static_cast<size_t>(size)), second(static_cast<size_t>(size));
    run_group(size, [&](int r, Communicator& c) {
      auto a = c.allocate_group_buffer(256), b = c.allocate_group_buffer(64);
      REQUIRE(a);
      REQUIRE(b);
      first[size_t(r)] = a.get();
      second[size_t(r)] = b.get();
      reinterpret_cast<int32_t*>(a.get())[r] = r;
      c.barrier();
      for (int p = 0; p < size; ++p) CHECK(reinterpret_cast<int32_t*>(a.get())[p] == p);
    });
    for (int r = 0; r < size; ++r) {
      CHECK(first[size_t(r)] == first[0]);
      CHECK(second[size_t(r)] == second[0]);
    }
    CHECK(first[0] != second[0]);
  }
  // Members out of step (each names another program's gather): whoever asks second gets an
  // InternalError instead of the other's memory.
  std::atomic<int> threw{0};
  run_group(2, [&](int r, Communicator& c) {
    try {
      (void)c.allocate_group_buffer(256, 7 + uint64_t(r));
    } catch (const InternalError& e) {
      ++threw;
      CHECK(std::string(e.what()).find("fell out of step") != std::string::npos);
    }
  });
  CHECK(threw == 1);
}

TEST_CASE("NCCL exchange plans (backend/cuda/nccl_exchange.hpp): all_to_all_v's run-time split sizes, uneven all_gather_v and reduce_scatter_v") {
  // all_to_all_v on rank 1 of 3: block p of the input to rank p, rank p's block into the output,
  // each back to back in rank order; zero-element blocks stay in the plan (nothing is queued for them).
  const std::vector<int64_t> send = {2, 0, 5}, recv = {3, 0, 1};
  CHECK(exchange_transfers(1, packed_blocks(send), packed_blocks(recv), "all_to_all_v") ==
        std::vector<PeerTransfer>{{0, {0, 2}, {0, 3}}, {1, {2, 0}, {3, 0}}, {2, {2, 5}, {3, 1}}});
  // A rank's block to itself must be as long as the one it expects: a typed error, before any call.
  CHECK_THROWS_WITH_AS(exchange_transfers(0, packed_blocks(send), packed_blocks(recv), "all_to_all_v"),
                       doctest::Contains("all_to_all_v: rank 0 sends 2 elements to itself but expects 3"), CommError);
  // Uneven all_gather_v on rank 2: the same block to every peer, peer p's into its slot.
  const std::vector<PeerTransfer> gather =
      exchange_transfers(2, same_block(3, 4), packed_blocks(std::vector<int64_t>{1, 3, 4}), "all_gather_v");
  CHECK(gather[0] == PeerTransfer{0, {0, 4}, {0, 1}});
  CHECK(gather[1] == PeerTransfer{1, {0, 4}, {1, 3}});
  CHECK(gather[2] == PeerTransfer{2, {0, 4}, {4, 4}});
  // Uneven reduce_scatter_v on rank 1 (its block: 3 elements): block p of the input to rank p,
  // every rank's copy of this rank's block side by side for the rank-ordered reduction.
  const std::vector<PeerTransfer> scatter =
      exchange_transfers(1, packed_blocks(std::vector<int64_t>{2, 3, 1}), equal_blocks(3, 3), "reduce_scatter_v");
  CHECK(scatter == std::vector<PeerTransfer>{{0, {0, 2}, {0, 3}}, {1, {2, 3}, {3, 3}}, {2, {5, 1}, {6, 3}}});
  CHECK_THROWS_AS(exchange_transfers(0, equal_blocks(2, 1), equal_blocks(3, 1), "x"), InternalError);
}
