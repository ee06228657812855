#include "plan/hardware_profiles.hpp"

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "dsl/error.hpp"
#include "dsl/logging.hpp"
#include "dsl/ops.hpp"
#include "jit/compile_cache.hpp"
#include "jit/jit_function.hpp"
#include "jit/backend_registry.hpp"
#include "jit/device_workers.hpp"
#include "plan/other_work_meter.hpp"
#include "jit/runtime.hpp"
#include "jit/step_profiler.hpp"

namespace tessera {
namespace {

// The middle value (the upper of the two middle ones for an even count).
double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + ptrdiff_t(values.size() / 2), values.end());
  return values[values.size() / 2];
}

// The median of `repeats` timed calls after one untimed one (compiling, first touches): the rate
// a step sees. The best call measured a shared machine's fast moments: steps then ran 8-20%
// slower than predicted, with the median 5-10% (plan_bench --accuracy --recalibrate).
template <class F>
double median_seconds(const F& call, int repeats = 9) {
  call();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(std::move(times));
}

Tensor filled(const Mesh& mesh, std::vector<int64_t> shape, DType dtype, std::vector<Placement> placements = {Replicate{}}) {
  const int64_t rank = int64_t(shape.size());
  return full(std::move(shape), 0.5, Layout::from_placements(mesh, placements, rank), dtype);
}

// `shape` on each of the mesh's devices: its first dimension repeated once per device and
// sharded over them, so every device runs the same work at once and a time is what one device
// takes while its neighbours are busy too. (The first dimension stays the one a kernel splits
// over a device's cores.)
Tensor on_each_device(const Mesh& mesh, std::vector<int64_t> shape, DType dtype) {
  shape[0] *= mesh.size();
  return filled(mesh, std::move(shape), dtype, {Shard{0}});
}

// `batch` n x n by n x n products in one batched GEMM on each device.
double gemm_rate(const Mesh& mesh, DType dtype, int64_t n, int64_t batch = 1) {
  const Tensor a = on_each_device(mesh, {batch, n, n}, dtype), b = on_each_device(mesh, {batch, n, n}, dtype);
  auto step = jit([](const Tensor& x, const Tensor& y) { return matmul(x, y); });
  return 2.0 * double(batch) * double(n) * double(n) * double(n) / median_seconds([&] { (void)step(a, b); });
}

// Square GEMMs of `dtype` from 16 to `largest` (small ones batched, about the same work each):
// their rates, at intensity n / 3 (set_gemm_curve turns them into the peak and its fractions).
std::vector<std::pair<double, double>> measure_gemm_rates(const Mesh& mesh, DType dtype, int64_t largest = 512) {
  std::vector<std::pair<double, double>> rates;
  for (int64_t n = 16; n <= largest; n *= 2) {
    const int64_t batch = std::max<int64_t>(1, (largest / n) * (largest / n) * (largest / n) / 8);
    rates.push_back({double(n) / 3.0, gemm_rate(mesh, dtype, n, batch)});
  }
  return rates;
}

// The peak of measured GEMM rates and the fraction of it each intensity reaches, as `dtype`'s
// GEMM figures of `h` (f32's curve is the default one).
void set_gemm_curve(Hardware& h, DType dtype, std::vector<std::pair<double, double>> rates) {
  double peak = 0;
  for (const auto& point : rates) peak = std::max(peak, point.second);
  for (auto& point : rates) point.second /= peak;
  h.gemm_flops[dtype] = peak;
  if (dtype == DType::f32)
    h.gemm_efficiency = std::move(rates);
  else
    h.gemm_efficiency_by_dtype[dtype] = std::move(rates);
}

// The rate fused kernels reach: 16 ops per element of an n x n block (1024: a CPU's), as
// training steps fuse them (operands broadcast along rows and along columns, a comparison and a
// select, a round trip through a wider dtype), not a peak that only a bare multiply-add chain
// reaches.
double vector_rate(const Mesh& mesh, DType dtype, int64_t n = 1024) {
  const Tensor x = on_each_device(mesh, {n, n}, dtype), row = filled(mesh, {n}, dtype), column = on_each_device(mesh, {n, 1}, dtype);
  const DType wide = dtype == DType::f32 ? DType::f64 : DType::f32;  // 16-bit types widen as mixed precision does
  auto step = jit([wide, dtype](const Tensor& v, const Tensor& r, const Tensor& c) {
    Tensor acc = v;
    for (int i = 0; i < 3; ++i) acc = acc * r + c;                     // 6 ops
    acc = where(acc <= c, acc * 0.5, acc);                              // 3
    acc = cast(cast(acc, wide) * 0.999 + 0.001, dtype);                 // 4
    return acc * r + c - 1.0;                                           // 3
  });
  return 16.0 * double(n * n) / median_seconds([&] { (void)step(x, row, column); });
}

// One special function evaluated eight times per element read, so it, not memory, sets the
// time: on eight scalings of the element, independent of one another and summed, as a model's
// kernels evaluate it once per element of a long loop. (Eight evaluations chained one into the
// next measured their latency instead, the chain's length in a vector loop: tanh at 1.9e9 per
// second on a 2-core Zen 4 whose GELU kernels evaluated 3.9e9, and every GELU was planned at
// twice its time.) Values stay in range: exp(-x) and tanh(x) of values in (0, 1], pow(x, 0.9)
// of values in (0, 1), log(x + 2) of positive ones (the scale and the add ride along, as other
// ops do in a model's kernels).
double special_function_rate(const Mesh& mesh, DType dtype, SpecialFunction f, int64_t elements = 1 << 18) {
  const Tensor x = on_each_device(mesh, {elements}, dtype);
  auto step = jit([f](const Tensor& v) {
    Tensor sum;
    for (int i = 0; i < 8; ++i) {
      const Tensor scaled = v * (1.0 - 0.0625 * i);
      Tensor value;
      switch (f) {
        case SpecialFunction::exp: value = exp(-scaled); break;
        case SpecialFunction::log: value = log(scaled + 2.0); break;
        case SpecialFunction::tanh: value = tanh(scaled); break;
        case SpecialFunction::pow: value = pow(scaled, 0.9); break;
      }
      sum = i == 0 ? value : sum + value;
    }
    return sum;
  });
  return 8.0 * double(elements) / median_seconds([&] { (void)step(x); });
}

// A copy with a scale of n floats on each device: every byte read once and written once, less
// `call`, the cost of the call itself on that mesh (call_seconds(mesh)). A call on a mesh of
// several devices wakes each one's thread: 7.5 us on two one-core devices against 5.5 on one,
// which a copy half filling a core's L2 (9-17 us) cannot hide. Less one device's cost, the L2s
// of a 2-core VM's two busy cores measured 6.9 GB/s, a fourth of their 29. The median is of 49
// calls, as call_seconds' is of 50: of 9, one calibration in twelve read the L2 at 5.1 GB/s
// and a stored profile held 5.6, slower than the memory, which planned a GPT step's kernels
// 1.7-2.3x slow on two one-core devices. A copy from memory takes milliseconds, which a call's
// cost cannot blur: 9 calls do.
double copy_bandwidth(const Mesh& mesh, int64_t n, double call, int repeats = 49) {
  const Tensor x = on_each_device(mesh, {n}, DType::f32);
  auto step = jit([](const Tensor& v) { return v * 2.0; });
  const double seconds = median_seconds([&] { (void)step(x); }, repeats);
  return 2.0 * 4.0 * double(n) / std::max(seconds - call, seconds / 2);
}

// A copy of n floats that stays in the cores' L2s, which no machine serves slower than its
// memory: a rate below that is a stall of the moment (a whole-machine calibration of this
// project's 2-core VM once stored its L2 at 3.8 GB/s, a fourth of its memory's rate, where six
// others read 38-104, and every later plan of a one-device GPT step was 30% slow). Such a copy
// is timed again, up to three times; one never faster than the memory gets the memory's rate.
double cache_bandwidth(const Mesh& mesh, int64_t n, double call, double memory_rate) {
  double rate = 0;
  for (int attempt = 0; attempt < 4 && rate <= memory_rate; ++attempt) rate = std::max(rate, copy_bandwidth(mesh, n, call));
  return std::max(rate, memory_rate);
}

// The size of cpu0's unified cache at `level` as the kernel reports it (0 where it does not):
// level 2, one core's L2; level 3, the L3 every core shares. A kernel's output lands in its
// core's L2 and is read back from there; what the L2 evicts goes to the L3 (the victim cache of
// this project's AMD CPU), where a small model's other values stay: a copy touching 8 MiB ran at
// 54-82 GB/s a core there against 15-21 from memory.
int64_t unified_cache_bytes(int level) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level"), type_file(dir + "/type"), size_file(dir + "/size");
    int found_level = 0;
    std::string type;
    int64_t size = 0;
    char unit = 0;
    if (!(level_file >> found_level)) break;
    if (found_level != level || !(type_file >> type) || type != "Unified" || !(size_file >> size >> unit)) continue;
    return size * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
  }
  return 0;
}

// The part of the L3 a device finds its values in, and their bandwidth there: copies touching
// 1/16, 1/8, 1/4 and 1/2 of it; the largest running at 1.5 times the memory's rate or more, at
// the median rate of those that do. On a VM the L3 is shared with other tenants' cores, so what
// /sys reports need not stay: on this project's 2-core VMs, copies touching 16 of the 32 MiB
// ran at 1.3-2.6x the memory's speed, 1 to 8 MiB at 2-3.4x (one of those below 2x on a noisy
// run was enough to find no L3 at all, when the first miss ended the search).
// The mesh's devices share what each copy touches; the rate is one device's.
std::pair<int64_t, double> shared_cache(const Mesh& mesh, double call, double memory_rate) {
  const int64_t reported = unified_cache_bytes(3);
  int64_t largest = 0;
  std::vector<double> rates;
  for (int64_t touched = reported / 16; touched > 0 && touched <= reported / 2; touched *= 2) {
    const double rate = copy_bandwidth(mesh, touched / 8 / mesh.size(), call);  // n floats touch 8n bytes
    if (rate < 1.5 * memory_rate) continue;
    largest = touched;
    rates.push_back(rate);
  }
  if (rates.empty()) return {0, 0.0};
  return {largest, median(std::move(rates))};
}

// The median time of a one-op call with one element on each of the mesh's devices.
double call_seconds(const Mesh& mesh) {
  const Tensor x = on_each_device(mesh, {1}, DType::f32);
  auto step = jit([](const Tensor& v) { return v + 1.0; });
  return median_seconds([&] { (void)step(x); }, 50);
}

// The median time of an all_reduce of n floats between two devices.
double pair_all_reduce_seconds(int64_t n) {
  const Mesh two = create_mesh({{"x", 2}}, cpu_devices(2));
  const Tensor x = filled(two, {2, n}, DType::f32, {Shard{0}});
  auto step = jit([](const Tensor& v) { return reduce_sum(v, {0}).redistribute({Replicate{}}); });
  return median_seconds([&] { (void)step(x); }, 9);
}

// A ring of two takes two latencies; the call's own cost is not the link's.
double latency_from(double small, double launch) { return std::max(small - launch, small / 4) / 2; }

// An all_reduce of n floats over two devices moves n * 4 bytes each way and costs two
// latencies (a ring of two): fitted from a one-float call and a 4 MiB one, less the cost of a
// call itself (`launch`). A busy machine can make the small call as slow as the large one; the
// large one's own rate is then taken, and no link is faster than the memory it copies through.
Link in_process_link(double launch, double memory_bytes_per_second) {
  const int64_t n = int64_t(1) << 20;
  const double small = pair_all_reduce_seconds(1), large = pair_all_reduce_seconds(n);
  Link link;
  link.latency_seconds = latency_from(small, launch);
  const double transfer = large - small > 0.5 * large ? large - small : large;
  link.bytes_per_second = std::min(4.0 * double(n) / transfer, memory_bytes_per_second);
  return link;
}

// The rates of the device's arithmetic: GEMMs, fused kernels and special functions. A virtual
// machine's cores change speed with what its host runs beside them: this project's 2-core VM
// ran a whole-machine 512 x 512 GEMM at 125-133 GFLOP/s for seconds at a time, then at 78-81
// for seconds (a quarter of a 30-s run), and a calibration taken in one of the slow spells had
// planned every later step 30% slow. So f32's rates, which training steps run on, are measured
// in three passes spread over the calibration (before, between and after the memory and link
// measurements) and each is the median of its three: the machine's usual speed unless it was
// slow for most of the calibration. The other dtypes' are measured in the first pass only (all
// three passes made a calibration 2.5 times as long).
struct ComputeRates {
  std::map<DType, std::vector<std::vector<std::pair<double, double>>>> gemm;  // per dtype, per pass: measure_gemm_rates
  std::vector<double> f64_gemm;
  std::map<DType, std::vector<double>> vector;
  std::map<DType, std::map<SpecialFunction, std::vector<double>>> special;

  // One pass: every dtype's rates, or f32's alone.
  void measure(const Mesh& busy, bool every_dtype) {
    // bf16 GEMMs (mixed precision) are the backend's bf16 GEMM: VDPBF16PS tiles where the CPU
    // has them (1.6-1.8x f32's rate on Zen 4), f32 on widened operands elsewhere; converting and
    // packing the operands makes small ones fall further below that peak than f32's.
    for (DType dtype : {DType::f32, DType::bf16})
      if (every_dtype || dtype == DType::f32) gemm[dtype].push_back(measure_gemm_rates(busy, dtype));
    if (every_dtype) f64_gemm.push_back(gemm_rate(busy, DType::f64, 384));
    // bf16 and f16 kernels compute in f32 and round every op's result to the storage type
    // (codegen/storage_rounding.hpp): eight integer operations an op for bf16, more for f16,
    // which their own rates carry (a bf16 chain ran at a fifth of f32's rate on this project's
    // machine).
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      if (!every_dtype && dtype != DType::f32) continue;
      vector[dtype].push_back(vector_rate(busy, dtype));
      // Special functions are computed in f32 for bf16 and f16 values, so f32's rates serve them.
      if (dtype == DType::f32 || dtype == DType::f64)
        for (SpecialFunction f : kSpecialFunctions) special[dtype][f].push_back(special_function_rate(busy, dtype, f));
    }
  }

  void set_medians(Hardware& h) const {
    for (const auto& [dtype, passes] : gemm) {
      std::vector<std::pair<double, double>> rates = passes.front();
      for (size_t size = 0; size < rates.size(); ++size) {
        std::vector<double> each;
        for (const auto& pass : passes) each.push_back(pass[size].second);
        rates[size].second = median(each);
      }
      set_gemm_curve(h, dtype, std::move(rates));
    }
    h.gemm_flops[DType::f64] = median(f64_gemm);
    for (const auto& [dtype, each] : vector) h.vector_flops[dtype] = median(each);
    for (const auto& [dtype, by_function] : special)
      for (const auto& [f, each] : by_function) h.special_functions_per_second[dtype][f] = median(each);
  }
};

// The measured profiles' cache key: one per machine shape (cores, and the CPU LLVM compiles
// for) and per device shape (the whole machine, or one core). (v15: those stored before hold
// one rate for all special functions; v16: special functions timed as a chain, their latency;
// v17: memory timed on 128 MiB, partly in a large L3.)
std::string cache_key(bool one_core) {
  return "hardware-this-machine-v18-" + std::to_string(machine_cores()) + "-cores-" + target_for(DeviceKind::CPU, false).arch +
         (one_core ? "-one-core" : "-whole");
}

// Sets the cores each device owns while it lives, then puts back what was set before.
class CoresPerDevice {
 public:
  explicit CoresPerDevice(int cores) : previous_(cores_per_device_override()) { set_cores_per_device(cores); }
  ~CoresPerDevice() { set_cores_per_device(previous_); }

 private:
  int previous_;
};

// The process's calibrations (whole machine, one core), once each unless recalibrated.
struct Calibrations {
  std::mutex mutex;
  std::optional<Hardware> measured[2];
};
Calibrations& calibrations() {
  static Calibrations c;
  return c;
}

// The compile cache stores them (private folder, checksummed, written atomically).
CompileCache& calibration_cache() {
  static CompileCache cache(".json");
  return cache;
}

// A stored calibration: the profile and how busy the machine was while it was measured.
std::string stored_calibration(const Calibration& c) {
  return nlohmann::json{{"others_share", c.others_share}, {"quiet", c.quiet()}, {"hardware", nlohmann::json::parse(hardware_to_json(c.hardware))}}
      .dump(1);
}

Calibration parsed_calibration(const std::string& stored) {
  try {
    const nlohmann::json j = nlohmann::json::parse(stored);
    Calibration c;
    c.hardware = hardware_from_json(j.at("hardware").dump());
    c.others_share = j.at("others_share").get<double>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw IOError(std::string("a stored calibration of this machine is damaged: ") + e.what());
  }
}

// A calibration taken under load serves until one is asked for: its rates are low by about the
// share other work took, which the warning says once per process.
void warn_if_noisy(const Calibration& c) {
  if (c.quiet()) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    component_logger("jit").warn("this machine's profile for plans was measured while other work took {:.0f}% of the cores' time; "
                                 "its rates may be low (recalibrate_this_machine() measures again)",
                                 100 * c.others_share);
  });
}

// Measured now, kept for this process and stored for later ones, quiet or not (a noisy one is
// marked so). The caller holds calibrations().mutex.
const Hardware& measure_and_keep(bool one_core) {
  std::optional<Hardware>& m = calibrations().measured[one_core ? 1 : 0];
  const Calibration c = calibrate_this_machine(one_core ? 1 : 0);
  m = c.hardware;
  calibration_cache().store(cache_key(one_core), stored_calibration(c));
  warn_if_noisy(c);
  return *m;
}

Hardware cached_measurement(bool one_core) {
  std::lock_guard lock(calibrations().mutex);
  std::optional<Hardware>& m = calibrations().measured[one_core ? 1 : 0];
  if (m) return *m;
  // A damaged entry is measured again.
  if (const std::string stored = calibration_cache().find(cache_key(one_core)); !stored.empty()) {
    try {
      const Calibration c = parsed_calibration(stored);
      warn_if_noisy(c);
      m = c.hardware;
      return *m;
    } catch (const Error&) {
    }
  }
  // Planning on a real CPU mesh needs this machine's rates: a few seconds, once, said once.
  static std::once_flag notice;
  std::call_once(notice, [] {
    const std::string dir = compile_cache_dir();
    component_logger("jit").warn("calibrating this machine for plans (a few seconds, once{}; pass a Hardware to plan() to skip it)",
                                 dir.empty() ? ": the compile cache is off, so every process measures again" : "; kept in " + dir);
  });
  return measure_and_keep(one_core);
}

std::atomic<int64_t> calibrations_counted{0};

}  // namespace

Calibration calibrate_this_machine(int cores) {
  ++calibrations_counted;
  const UnprofiledScope unprofiled;  // its programs are not the user's (TESSERA_PROFILE)
  const OtherWorkMeter others;
  CoresPerDevice owned(cores);
  // Rates are measured on every device of a mesh that fills the machine, all at once: cores
  // that run alone go faster than when each has a neighbour at work (on this project's 2-core
  // VM, one core's GEMMs ran 15-20% faster alone), and a mesh's devices do run at once. The
  // cost of a call is one device's.
  const int64_t devices = cores ? std::max(1, machine_cores() / cores) : 1;
  const Mesh one = create_mesh({{"x", 1}}, cpu_devices(1));
  const Mesh busy = devices == 1 ? one : create_mesh({{"x", devices}}, cpu_devices(int(devices)));
  Hardware h;
  h.name = cores ? "this-machine-" + std::to_string(cores) + "-core" : "this-machine";
  h.device = DeviceKind::CPU;
  ComputeRates rates;
  rates.measure(busy, true);
  h.memory_bytes = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  h.launch_seconds = call_seconds(one);
  const double busy_call = devices == 1 ? h.launch_seconds : call_seconds(busy);
  // From memory: 512 MiB touched in all, at least 16 MiB by each device. (128 MiB partly stayed
  // in a large L3: a 2-core Zen 4 guest, whose L3 CPUID reports as 508 MiB, timed 74-80 GB/s
  // there for the whole machine, where two threads streamed 71-84 GB/s over 32-64 MiB but
  // 55-64 over 128-512 MiB, and every one-device GPT step was planned 20-25% fast; at 512
  // MiB, 46-62 GB/s and 12-20%.) Like f32's rates, timed in three passes over the calibration
  // and their median kept: the same guest's memory ran at 29 GB/s for minutes, at 60 for others.
  const int64_t floats = std::max<int64_t>(int64_t(1) << 21, (int64_t(1) << 26) / devices);
  std::vector<double> memory_rates;
  auto memory_pass = [&] { memory_rates.push_back(copy_bandwidth(busy, floats, busy_call, 9)); };
  memory_pass();
  h.memory_bytes_per_second = memory_rates.front();  // the later caches' and links' yardstick
  // The cores' L2s: a copy touching half of them, repeated (the values a kernel's producers
  // just wrote are found there); the L3 behind them: the part of it that keeps values.
  h.cache_bytes = unified_cache_bytes(2) * (cores ? cores : machine_cores());
  if (h.cache_bytes > 0) h.cache_bytes_per_second = cache_bandwidth(busy, h.cache_bytes / 16, busy_call, h.memory_bytes_per_second);
  rates.measure(busy, false);
  memory_pass();
  std::tie(h.shared_cache_bytes, h.shared_cache_bytes_per_second) = shared_cache(busy, busy_call, h.memory_bytes_per_second);
  h.cores = cores ? cores : machine_cores();
  {
    CoresPerDevice one_core_each(1);  // two devices of one core each, as every machine can hold
    h.intra_node = in_process_link(h.launch_seconds, h.memory_bytes_per_second);
    h.inter_node = h.intra_node;  // one machine: every link is within it
  }
  rates.measure(busy, false);
  memory_pass();
  rates.set_medians(h);
  h.memory_bytes_per_second = median(std::move(memory_rates));
  return {h, others.others_share()};
}

Hardware calibrate_gpu(const Hardware& base) {
  if (gpu_devices().empty()) throw DeviceError("calibrate_gpu: this process has no GPU");
  const UnprofiledScope unprofiled;
  const Mesh gpu = create_mesh({{"x", 1}}, gpu_devices(1));
  Hardware h = base;
  h.name = base.name + "-measured";
  h.device = DeviceKind::GPU;
  h.gemm_efficiency.clear();
  h.gemm_efficiency_by_dtype.clear();
  // GEMMs up to 4096 (a GPU reaches its peak past where a CPU core does), cuBLAS's in both dtypes.
  for (DType dtype : {DType::f32, DType::bf16}) set_gemm_curve(h, dtype, measure_gemm_rates(gpu, dtype, 4096));
  h.gemm_flops[DType::f64] = gemm_rate(gpu, DType::f64, 2048);
  // Blocks large enough that the call's own cost is small beside them (64 MiB of f32).
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) h.vector_flops[dtype] = vector_rate(gpu, dtype, 4096);
  h.special_functions_per_second.clear();
  for (DType dtype : {DType::f32, DType::f64})
    for (SpecialFunction f : kSpecialFunctions) h.special_functions_per_second[dtype][f] = special_function_rate(gpu, dtype, f, 1 << 24);
  h.launch_seconds = call_seconds(gpu);
  h.memory_bytes_per_second = copy_bandwidth(gpu, int64_t(1) << 26, h.launch_seconds);
  h.cache_bytes = h.shared_cache_bytes = 0;  // planned as the published GPU profiles are: every byte from memory
  h.cache_bytes_per_second = h.shared_cache_bytes_per_second = 0;
  h.cores = 1;
  check_hardware(h, "calibrate_gpu");
  return h;
}

int64_t calibrations_taken() { return calibrations_counted.load(); }

Hardware measure_this_machine(int cores) { return calibrate_this_machine(cores).hardware; }

// A collective's round trip on a quiet machine costs microseconds; one over 50 us means other
// work held the cores while it was measured, as does other work taking a tenth of their time
// (a build or test run beside it halved the GEMM and memory rates and left the round trip at
// 7 us).
bool Calibration::quiet() const { return others_share < 0.1 && hardware.intra_node.latency_seconds < 50e-6; }

Hardware recalibrate_this_machine() {
  std::lock_guard lock(calibrations().mutex);
  measure_and_keep(true);
  return measure_and_keep(false);
}

Hardware hardware_profile(const std::string& name) {
  if (name != "this-machine") return published_hardware(name);
  return cached_measurement(false);
}

Hardware this_machine_device(int64_t devices) {
  const Hardware whole = cached_measurement(false);
  const int64_t sharing = std::max<int64_t>(1, devices) * clients_on_this_machine();
  const int owned = cores_per_device(devices);
  // One device with every core is the whole machine; one held to fewer (TESSERA_CORES_PER_DEVICE,
  // set_cores_per_device) has their rate, as below.
  if (sharing == 1 && owned >= machine_cores()) return whole;
  const Hardware core = cached_measurement(true);
  const double cores = double(machine_cores());
  // Devices with several cores reach the whole machine's per-core rate; devices that outnumber
  // the cores get their share of one.
  const double share = std::min(1.0, cores / double(sharing * owned));
  auto scaled = [&](double core_rate, double whole_rate) {
    const double per_core = owned > 1 ? std::min(core_rate, whole_rate / cores) : core_rate;
    return per_core * owned * share;
  };
  Hardware h = core;
  h.name = fmt::format("this-machine ({} devices sharing {} cores)", sharing, machine_cores());
  h.cores = owned;
  for (auto& [dtype, rate] : h.gemm_flops) rate = scaled(rate, whole.gemm_rate(dtype));
  for (auto& [dtype, rate] : h.vector_flops) rate = scaled(rate, whole.vector_rate(dtype));
  for (auto& [dtype, rates] : h.special_functions_per_second)
    for (auto& [f, rate] : rates) rate = scaled(rate, whole.special_function_rate(dtype, f));
  if (owned > 1) h.gemm_efficiency = whole.gemm_efficiency, h.gemm_efficiency_by_dtype = whole.gemm_efficiency_by_dtype;
  // The memory's bandwidth and size are divided among the devices running at once.
  h.memory_bytes_per_second = std::min(scaled(core.memory_bytes_per_second, whole.memory_bytes_per_second),
                                       whole.memory_bytes_per_second / double(sharing));
  h.memory_bytes = whole.memory_bytes / sharing;
  // Each device has its cores' caches, shared with the devices taking turns on them.
  h.cache_bytes = int64_t(double(core.cache_bytes) * owned * share);
  h.cache_bytes_per_second = scaled(core.cache_bytes_per_second, whole.cache_bytes_per_second);
  // The shared cache holds the values of every device on the machine, and its bandwidth is
  // divided among the devices running at once, as the memory's is (a copy in the L3 on both
  // cores of this project's VM ran no faster than on one).
  // (A one-core calibration that found no such cache, its devices' copies too close to the
  // memory's speed, leaves the whole machine's share.)
  h.shared_cache_bytes = whole.shared_cache_bytes / sharing;
  h.shared_cache_bytes_per_second = whole.shared_cache_bytes_per_second / double(sharing);
  if (core.shared_cache_bytes_per_second > 0)
    h.shared_cache_bytes_per_second = std::min(h.shared_cache_bytes_per_second,
                                               scaled(core.shared_cache_bytes_per_second, whole.shared_cache_bytes_per_second));
  // A call, and each hop of a collective, waits while the threads it needs take turns.
  h.launch_seconds = core.launch_seconds / share;
  for (Link* link : {&h.intra_node, &h.inter_node}) {
    link->latency_seconds /= share;
    link->bytes_per_second *= share;
  }
  return h;
}

}  // namespace tessera
