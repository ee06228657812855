#include "comm/shared_buffer_pool.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <atomic>
#include <string>

#include "comm/shared_segment.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"

namespace tessera {
namespace {

constexpr int kMaxBlocks = 256;  // pieces of the pool (in use or free), sorted by offset
constexpr int kMaxTickets = 64;  // allocations some members have taken and others not yet
constexpr int64_t kAlign = 64;

int64_t aligned(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }

}  // namespace

// The shared segment's records, named outside the anonymous namespace: Control (a member of the
// pool's class) holds them, and a unity build would otherwise warn (-Wsubobject-linkage).
namespace shared_pool_records {

struct Block {
  int64_t offset, size;
  int32_t holders;  // members that have not dropped it yet; 0: free
};

struct Ticket {
  int64_t number, bytes, offset;  // offset -1: the pool had no room
  uint64_t purpose;
  int32_t takers;                 // members that have taken it; 0: the entry is unused
};

}  // namespace shared_pool_records

namespace {

using shared_pool_records::Block;
using shared_pool_records::Ticket;

// Held only for a few hundred instructions; a waiter yields after a while in case the holder
// lost its core (more clients than cores).
class SpinLock {
 public:
  explicit SpinLock(std::atomic<uint32_t>& word) : word_(word) {
    for (int spins = 0; word_.exchange(1, std::memory_order_acquire) != 0; ++spins) {
      if (spins > 1000) sched_yield();
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
  ~SpinLock() { word_.store(0, std::memory_order_release); }

 private:
  std::atomic<uint32_t>& word_;
};

}  // namespace

struct SharedBufferPool::Control {
  std::atomic<uint32_t> lock;
  int32_t block_count;  // 0 until the first allocation lays out the one free block
  Block blocks[kMaxBlocks];
  Ticket tickets[kMaxTickets];
};

int64_t SharedBufferPool::control_bytes() { return aligned(int64_t(sizeof(Control))); }

SharedBufferPool::SharedBufferPool(std::unique_ptr<SharedSegment> segment, int size)
    : segment_(std::move(segment)), size_(size), capacity_(int64_t(segment_->size()) - control_bytes()) {}

SharedBufferPool::~SharedBufferPool() = default;

std::shared_ptr<SharedBufferPool> SharedBufferPool::create(void* mpi_comm, int members, int64_t capacity_bytes) {
  std::unique_ptr<SharedSegment> segment;
  try {
    segment = SharedSegment::create(mpi_comm, size_t(control_bytes() + aligned(capacity_bytes)));
  } catch (const CommError& e) {
    // The pool only saves copies (gathers work without it), so a /dev/shm too small for it
    // costs speed, not the job; but it is said, not silent.
    component_logger("comm").warn("{}; this group's gathers move data the usual way (TESSERA_SHARED_POOL_MB sizes the pool)", e.what());
    return nullptr;
  }
  if (!segment) return nullptr;
  std::shared_ptr<SharedBufferPool> pool(new SharedBufferPool(std::move(segment), members));
  pool->self_ = pool;
  return pool;
}

SharedBufferPool::Control& SharedBufferPool::control() const { return *reinterpret_cast<Control*>(segment_->data()); }
std::byte* SharedBufferPool::data_area() const { return segment_->data() + control_bytes(); }

int64_t SharedBufferPool::carve(int64_t bytes) {
  Control& c = control();
  if (c.block_count == 0) {
    c.blocks[0] = {0, capacity_, 0};
    c.block_count = 1;
  }
  int best = -1;  // the smallest free block that fits
  for (int i = 0; i < c.block_count; ++i)
    if (c.blocks[i].holders == 0 && c.blocks[i].size >= bytes && (best < 0 || c.blocks[i].size < c.blocks[best].size)) best = i;
  if (best < 0) return -1;
  if (c.blocks[best].size > bytes && c.block_count < kMaxBlocks) {  // split off the rest
    for (int i = c.block_count; i > best + 1; --i) c.blocks[i] = c.blocks[i - 1];
    c.blocks[best + 1] = {c.blocks[best].offset + bytes, c.blocks[best].size - bytes, 0};
    c.blocks[best].size = bytes;
    ++c.block_count;
  }
  c.blocks[best].holders = size_;
  return c.blocks[best].offset;
}

std::shared_ptr<std::byte[]> SharedBufferPool::allocate(int64_t bytes, uint64_t purpose) {
  const int64_t number = ++tickets_taken_;
  const int64_t size = aligned(bytes);
  Control& c = control();
  int64_t offset = -1;
  for (bool placed = false; !placed;) {
    SpinLock lock(c.lock);
    Ticket* mine = nullptr;
    Ticket* unused = nullptr;
    for (Ticket& t : c.tickets) {
      if (t.takers > 0 && t.number == number) mine = &t;
      if (t.takers == 0 && !unused) unused = &t;
    }
    if (mine) {  // another member came first
      if (mine->bytes != bytes || mine->purpose != purpose)
        throw InternalError(fmt::format("shared buffer #{}: {} bytes for {:016x} here, {} bytes for {:016x} for another client "
                                        "(the clients run different programs or fell out of step)",
                                        number, bytes, purpose, mine->bytes, mine->purpose));
      offset = mine->offset;
      if (++mine->takers == size_) mine->takers = 0;
      placed = true;
    } else if (size_ == 1 || unused) {
      offset = carve(size);
      if (size_ > 1) *unused = {number, bytes, offset, purpose, 1};
      placed = true;
    }
    // else: every ticket is waiting for a slower member; retry once it has taken one.
  }
  if (offset < 0) return nullptr;
  std::shared_ptr<SharedBufferPool> self = self_.lock();
  return std::shared_ptr<std::byte[]>(data_area() + offset, [self, offset](std::byte*) { self->release(offset); });
}

int64_t SharedBufferPool::offset_of(const void* p, int64_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  if (b < data_area() || bytes < 0 || b + bytes > data_area() + capacity_) return -1;
  return b - data_area();
}

void SharedBufferPool::release(int64_t offset) {
  Control& c = control();
  SpinLock lock(c.lock);
  int i = 0;
  while (i < c.block_count && c.blocks[i].offset != offset) ++i;
  if (i == c.block_count || --c.blocks[i].holders > 0) return;
  auto merge_next = [&c](int k) {  // block k absorbs block k + 1
    c.blocks[k].size += c.blocks[k + 1].size;
    for (int j = k + 1; j + 1 < c.block_count; ++j) c.blocks[j] = c.blocks[j + 1];
    --c.block_count;
  };
  if (i + 1 < c.block_count && c.blocks[i + 1].holders == 0) merge_next(i);
  if (i > 0 && c.blocks[i - 1].holders == 0) merge_next(i - 1);
}

}  // namespace tessera
