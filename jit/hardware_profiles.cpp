#include "jit/hardware_profiles.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include "dsl/error.hpp"
#include "dsl/ops.hpp"
#include "jit/compile_cache.hpp"
#include "jit/jit_function.hpp"
#include "jit/backend_registry.hpp"
#include "jit/runtime.hpp"

namespace tessera {
namespace {

// The best of `repeats` timed calls after one untimed one (compiling, first touches): the
// machine's rate, not its noise.
template <class F>
double best_seconds(const F& call, int repeats = 5) {
  call();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    call();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

Tensor filled(const Mesh& mesh, std::vector<int64_t> shape, DType dtype, std::vector<Placement> placements = {Replicate{}}) {
  const int64_t rank = int64_t(shape.size());
  return full(std::move(shape), 0.5, Layout::from_placements(mesh, placements, rank), dtype);
}

double gemm_rate(const Mesh& one, DType dtype, int64_t n) {
  const Tensor a = filled(one, {n, n}, dtype), b = filled(one, {n, n}, dtype);
  auto step = jit([](const Tensor& x, const Tensor& y) { return matmul(x, y); });
  return 2.0 * double(n) * double(n) * double(n) / best_seconds([&] { (void)step(a, b); });
}

// 16 multiply-adds per element read: arithmetic, not memory, sets the time.
double vector_rate(const Mesh& one, DType dtype) {
  const Tensor x = filled(one, {1 << 20}, dtype);
  auto step = jit([](const Tensor& v) {
    Tensor acc = v;
    for (int i = 0; i < 16; ++i) acc = acc * 0.999 + 0.001;
    return acc;
  });
  return 32.0 * double(1 << 20) / best_seconds([&] { (void)step(x); });
}

// A copy with a scale: every byte read once and written once.
double memory_bandwidth(const Mesh& one) {
  const int64_t n = int64_t(1) << 24;
  const Tensor x = filled(one, {n}, DType::f32);
  auto step = jit([](const Tensor& v) { return v * 2.0; });
  return 2.0 * 4.0 * double(n) / best_seconds([&] { (void)step(x); });
}

double call_seconds(const Mesh& one) {
  const Tensor x = filled(one, {1}, DType::f32);
  auto step = jit([](const Tensor& v) { return v + 1.0; });
  return best_seconds([&] { (void)step(x); }, 50);
}

// An all_reduce of n floats over two devices moves n * 4 bytes each way and costs two
// latencies (a ring of two): fitted from a one-float call and a 4 MiB one, less the cost of a
// call itself (`launch`). A busy machine can make the small call as slow as the large one; the
// large one's own rate is then taken, and no link is faster than the memory it copies through.
Link in_process_link(double launch, double memory_bytes_per_second) {
  const Mesh two = create_mesh({{"x", 2}}, cpu_devices(2));
  auto all_reduce = [&](int64_t n) {
    const Tensor x = filled(two, {2, n}, DType::f32, {Shard{0}});
    auto step = jit([](const Tensor& v) { return reduce_sum(v, {0}).redistribute({Replicate{}}); });
    return best_seconds([&] { (void)step(x); }, 9);
  };
  const int64_t n = int64_t(1) << 20;
  const double small = all_reduce(1), large = all_reduce(n);
  Link link;
  link.latency_seconds = std::max(small - launch, small / 4) / 2;
  const double transfer = large - small > 0.5 * large ? large - small : large;
  link.bytes_per_second = std::min(4.0 * double(n) / transfer, memory_bytes_per_second);
  return link;
}

// The measured profile's cache key: one per machine shape (cores, and the CPU LLVM compiles for).
std::string cache_key() {
  return "hardware-this-machine-v2-" + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + "-cores-" +
         target_for(DeviceKind::CPU, false).arch;
}

}  // namespace

Hardware measure_this_machine() {
  const Mesh one = create_mesh({{"x", 1}}, cpu_devices(1));
  Hardware h;
  h.name = "this-machine";
  h.device = DeviceKind::CPU;
  h.gemm_flops = {{DType::f32, gemm_rate(one, DType::f32, 512)}, {DType::f64, gemm_rate(one, DType::f64, 384)}};
  h.vector_flops = {{DType::f32, vector_rate(one, DType::f32)}, {DType::f64, vector_rate(one, DType::f64)}};
  h.vector_flops[DType::bf16] = h.vector_flops[DType::f16] = h.vector_flops[DType::f32];  // computed in f32
  h.memory_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  h.memory_bytes_per_second = memory_bandwidth(one);
  h.launch_seconds = call_seconds(one);
  h.intra_node = in_process_link(h.launch_seconds, h.memory_bytes_per_second);
  h.inter_node = h.intra_node;  // one machine: every link is within it
  return h;
}

Hardware hardware_profile(const std::string& name) {
  if (name != "this-machine") return published_hardware(name);
  static std::mutex mutex;
  static std::optional<Hardware> measured;  // once per process
  std::lock_guard lock(mutex);
  if (measured) return *measured;
  // The compile cache stores it (private folder, checksummed, written atomically); a damaged
  // entry is measured again.
  static CompileCache cache(".json");
  const CachedArtifact entry = cache.get(cache_key(), [] { return hardware_to_json(measure_this_machine()); });
  try {
    measured = hardware_from_json(entry.bytes);
  } catch (const Error&) {
    measured = measure_this_machine();
  }
  return *measured;
}

}  // namespace tessera
