#include "comm/mpi_communicator.hpp"

#include <mpi.h>

#include <string>
#include <vector>

#include "comm/collective_timeout.hpp"
#include "comm/reduce_kernels.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

void check(int code, const char* what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw CommError(std::string(what) + " failed: " + std::string(text, size_t(length)));
  }
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16: case DType::f16: return MPI_UINT16_T;  // data movement only
  }
  throw InternalError("mpi_type: bad dtype");
}

// bools reduce as or (sum, max) / and (product, min), as reduce_kernels does.
MPI_Op mpi_op(ReduceOp op, DType d) {
  if (d == DType::u8) return op == ReduceOp::Product || op == ReduceOp::Min ? MPI_MIN : MPI_MAX;
  switch (op) {
    case ReduceOp::Sum: case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Product: return MPI_PROD;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  throw InternalError("mpi_op: bad op");
}

bool is_half(DType d) { return d == DType::bf16 || d == DType::f16; }

std::vector<int> to_int(std::span<const int64_t> v) {
  std::vector<int> out;
  for (int64_t x : v) {
    if (x > INT32_MAX) throw CommError("MPI collective of more than 2^31 elements per rank");
    out.push_back(int(x));
  }
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> out(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) out[i] = out[i - 1] + counts[i - 1];
  return out;
}

std::vector<float> widen(const void* data, int64_t n, DType d) {
  std::vector<float> out(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) out[i] = float(load_as_double(data, d, i));
  return out;
}

void narrow(const std::vector<float>& in, void* data, DType d) {
  for (size_t i = 0; i < in.size(); ++i) store_from_double(data, d, int64_t(i), in[i]);
}

void divide_for_avg(void* data, int64_t n, DType d, int size) {
  for (int64_t i = 0; i < n; ++i) store_from_double(data, d, i, load_as_double(data, d, i) / size);
}

// With a timeout, each rank announces its arrival to the others with a small message, so a hang
// can be blamed on the ranks missing.
constexpr int kArrivalTag = 0x7e55;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm), timeout_(collective_timeout_seconds()) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    if (is_half(dtype)) {
      std::vector<float> wide = widen(send, count, dtype);
      run("all_reduce", [&](MPI_Request* r) {
        return r ? MPI_Iallreduce(MPI_IN_PLACE, wide.data(), int(count), MPI_FLOAT, mpi_op(op, DType::f32), comm_, r)
                 : MPI_Allreduce(MPI_IN_PLACE, wide.data(), int(count), MPI_FLOAT, mpi_op(op, DType::f32), comm_);
      });
      narrow(wide, recv, dtype);
    } else {
      const void* s = send == recv ? MPI_IN_PLACE : send;
      run("all_reduce", [&](MPI_Request* r) {
        return r ? MPI_Iallreduce(s, recv, int(count), mpi_type(dtype), mpi_op(op, dtype), comm_, r)
                 : MPI_Allreduce(s, recv, int(count), mpi_type(dtype), mpi_op(op, dtype), comm_);
      });
    }
    if (op == ReduceOp::Avg) divide_for_avg(recv, count, dtype, size_);
  }

  void all_gather_v(const void* send, int64_t send_count, void* recv, std::span<const int64_t> recv_counts, DType dtype) override {
    std::vector<int> counts = to_int(recv_counts), displs = displacements(counts);
    const MPI_Datatype t = mpi_type(dtype);
    // MPI forbids aliased buffers: a block already at its place in recv is sent in place.
    const bool in_place = send == static_cast<const std::byte*>(recv) + int64_t(displs[size_t(rank_)]) * dtype_size(dtype);
    const void* from = in_place ? MPI_IN_PLACE : send;
    run("all_gather", [&](MPI_Request* r) {
      return r ? MPI_Iallgatherv(from, int(send_count), t, recv, counts.data(), displs.data(), t, comm_, r)
               : MPI_Allgatherv(from, int(send_count), t, recv, counts.data(), displs.data(), t, comm_);
    });
  }

  void reduce_scatter_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype, ReduceOp op) override {
    std::vector<int> c = to_int(counts);
    int64_t total = 0;
    for (int64_t x : counts) total += x;
    if (is_half(dtype)) {
      std::vector<float> wide = widen(send, total, dtype), out(static_cast<size_t>(c[rank_]));
      run("reduce_scatter", [&](MPI_Request* r) {
        return r ? MPI_Ireduce_scatter(wide.data(), out.data(), c.data(), MPI_FLOAT, mpi_op(op, DType::f32), comm_, r)
                 : MPI_Reduce_scatter(wide.data(), out.data(), c.data(), MPI_FLOAT, mpi_op(op, DType::f32), comm_);
      });
      narrow(out, recv, dtype);
    } else {
      run("reduce_scatter", [&](MPI_Request* r) {
        return r ? MPI_Ireduce_scatter(send, recv, c.data(), mpi_type(dtype), mpi_op(op, dtype), comm_, r)
                 : MPI_Reduce_scatter(send, recv, c.data(), mpi_type(dtype), mpi_op(op, dtype), comm_);
      });
    }
    if (op == ReduceOp::Avg) divide_for_avg(recv, counts[rank_], dtype, size_);
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    std::vector<int> sc = to_int(send_counts), rc = to_int(recv_counts), sd = displacements(sc), rd = displacements(rc);
    const MPI_Datatype t = mpi_type(dtype);
    run("all_to_all", [&](MPI_Request* r) {
      return r ? MPI_Ialltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_, r)
               : MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_);
    });
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    run("broadcast", [&](MPI_Request* r) {
      return r ? MPI_Ibcast(buffer, int(count), mpi_type(dtype), root, comm_, r) : MPI_Bcast(buffer, int(count), mpi_type(dtype), root, comm_);
    });
  }

  void barrier() override {
    run("barrier", [&](MPI_Request* r) { return r ? MPI_Ibarrier(comm_, r) : MPI_Barrier(comm_); });
  }

 private:
  // Runs a collective: blocking, or (with a timeout) non-blocking with a deadline. `start(nullptr)`
  // runs the blocking call; `start(&request)` starts the non-blocking one.
  template <class Start>
  void run(const char* what, Start start) {
    if (timeout_ <= 0) {
      check(start(nullptr), what);
      return;
    }
    // Announce arrival to every peer, and listen for theirs.
    const int64_t seq = ++sequence_;
    std::vector<MPI_Request> sends, recvs;
    std::vector<int64_t> heard(size_t(size_), 0);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      sends.emplace_back();
      MPI_Isend(&seq, 1, MPI_INT64_T, p, kArrivalTag, comm_, &sends.back());
      recvs.emplace_back();
      MPI_Irecv(&heard[size_t(p)], 1, MPI_INT64_T, p, kArrivalTag, comm_, &recvs.back());
    }
    MPI_Request request;
    check(start(&request), what);
    const double deadline = MPI_Wtime() + timeout_;
    int done = 0;
    while (!done) {
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
      if (!done && MPI_Wtime() > deadline) report_timeout(what, recvs);
    }
    MPI_Waitall(int(recvs.size()), recvs.data(), MPI_STATUSES_IGNORE);
    MPI_Waitall(int(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
  }

  [[noreturn]] void report_timeout(const char* what, std::vector<MPI_Request>& recvs) {
    std::vector<int> missing;
    size_t k = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      int arrived = 0;
      MPI_Test(&recvs[k++], &arrived, MPI_STATUS_IGNORE);
      if (!arrived) missing.push_back(p);
    }
    abort_on_collective_timeout(comm_, what, sequence_, timeout_, missing);
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  double timeout_ = 0;
  int64_t sequence_ = 0;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(void* mpi_comm) {
  return std::make_shared<MpiCommunicator>(static_cast<MPI_Comm>(mpi_comm));
}

}  // namespace tessera
